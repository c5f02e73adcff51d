//! Which devices the servers of this process hold, so that a reset of one
//! never destroys another client's memory.
//!
//! CUDA's `cuDevicePrimaryCtxReset` and HIP's `hipDeviceReset` destroy
//! everything on a device **for the whole process**: every client of that
//! device shares its primary context. A server that wants to reset its lost
//! device asks [`Holding::others`] first and refuses while it is not alone.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// How many servers of this process hold each device, by API and ordinal.
static HOLDERS: Mutex<BTreeMap<(&'static str, usize), usize>> = Mutex::new(BTreeMap::new());

/// One server's hold on its device, counted while it lives.
#[derive(Debug)]
pub struct Holding {
    key: (&'static str, usize),
}

impl Holding {
    /// Hold device `ordinal` of `api` (`"cuda"`, `"hip"`).
    pub fn new(api: &'static str, ordinal: usize) -> Self {
        let key = (api, ordinal);
        *HOLDERS.lock().entry(key).or_insert(0) += 1;
        Self { key }
    }

    /// How many servers of this process hold the device besides this one.
    pub fn others(&self) -> usize {
        HOLDERS
            .lock()
            .get(&self.key)
            .map_or(0, |n| n.saturating_sub(1))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut holders = HOLDERS.lock();
        if let Some(n) = holders.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                holders.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_counted_per_api_and_device() {
        let a = Holding::new("test-api", 0);
        assert_eq!(a.others(), 0);
        let b = Holding::new("test-api", 0);
        let elsewhere = Holding::new("test-api", 1);
        let other_api = Holding::new("other-test-api", 0);
        assert_eq!(a.others(), 1);
        assert_eq!(elsewhere.others(), 0);
        assert_eq!(other_api.others(), 0);
        drop(b);
        assert_eq!(a.others(), 0);
    }
}
