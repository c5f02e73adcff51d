//! The failure store the scope benches run over: taints in a vector indexed
//! by buffer slot and a pool of write sets, with nothing else around them —
//! the least a server's `FailureStore` can be, so a figure over it is the
//! scope's own cycle.

use scope_core::internals::{FailureStore, Failures, Taint, TaintSlot, WriteScoped};
use scope_core::{BufferId, BufferRange};

pub struct Store {
    pub failures: Failures,
    taints: Vec<Taint>,
    pool: Vec<Vec<BufferRange>>,
}

impl FailureStore for Store {
    fn failures(&mut self) -> &mut Failures {
        &mut self.failures
    }

    fn locate(&mut self, buffer: BufferId) -> (&mut Failures, TaintSlot<'_>) {
        match self.taints.get_mut(buffer.slot() as usize) {
            Some(taint) => (&mut self.failures, TaintSlot::Allocated(taint)),
            None => (&mut self.failures, TaintSlot::Gone),
        }
    }
}

impl WriteScoped for Store {
    type Store = Self;

    fn store(&mut self) -> &mut Self {
        self
    }

    fn write_set(&mut self) -> Vec<BufferRange> {
        self.pool.pop().unwrap_or_default()
    }

    fn recycle(&mut self, mut set: Vec<BufferRange>) {
        set.clear();
        self.pool.push(set);
    }
}

impl Store {
    /// A store with `buffers` clean buffers, slots `0..buffers`.
    pub fn new(buffers: usize) -> Self {
        Self {
            failures: Failures::new(),
            taints: (0..buffers).map(|_| Taint::new()).collect(),
            pool: Vec::new(),
        }
    }
}
