//! [`Few`]: a few `Copy` values, inline up to `N`, on the heap past that,
//! for a launch's short lists: a `Vec` allocates, `smallvec` is slower.

use std::mem::MaybeUninit;

pub(crate) struct Few<T: Copy, const N: usize> {
    /// How many of `inline` are written, while `heap` is empty.
    len: usize,
    inline: [MaybeUninit<T>; N],
    /// Every value, once there were more than `N`.
    heap: Vec<T>,
}

impl<T: Copy, const N: usize> Few<T, N> {
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            len: 0,
            inline: [const { MaybeUninit::uninit() }; N],
            heap: Vec::new(),
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, value: T) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = MaybeUninit::new(value);
                self.len += 1;
            }
            None => self.spill(value),
        }
    }

    /// Append the value `make` builds, built in its slot, not on the stack.
    #[inline]
    pub(crate) fn push_with(&mut self, make: impl FnOnce() -> T) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                slot.write(make());
                self.len += 1;
            }
            None => self.spill(make()),
        }
    }

    /// The list has outgrown its array: from now on every value is on the heap.
    #[cold]
    fn spill(&mut self, value: T) {
        if self.heap.is_empty() {
            let inline = self.inline_values().to_vec();
            self.heap = inline;
            // `len` stays `N`: `push` keeps coming here.
        }
        self.heap.push(value);
    }

    fn inline_values(&self) -> &[T] {
        let len = self.len.min(N);
        // SAFETY: `push` writes element `len` before counting it, and nothing
        // else changes `len` or `inline`. `MaybeUninit<T>` has `T`'s layout.
        unsafe { std::slice::from_raw_parts(self.inline.as_ptr().cast::<T>(), len) }
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            self.inline_values()
        } else {
            &self.heap
        }
    }
}

impl<T: Copy, const N: usize> std::ops::Deref for Few<T, N> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::Few;

    #[test]
    fn a_list_past_its_array_keeps_every_value_in_order() {
        let mut few: Few<u32, 2> = Few::new();
        assert!(few.is_empty());
        for i in 0..5 {
            if i % 2 == 0 {
                few.push(i);
            } else {
                few.push_with(|| i);
            }
            assert_eq!(&few[..], &(0..=i).collect::<Vec<_>>()[..]);
        }
    }
}
