//! A global allocator for the allocation-cap tests: it records, for the current thread
//! while a measurement is armed, the largest single allocation (or reallocation) and the
//! total bytes requested. A test binary has one global allocator, so each binary that
//! measures includes this module (`mod counting;`) and gets it installed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, plus per-thread records of what was requested.
pub struct Counting;

thread_local! {
    /// Whether this thread's allocations are being measured.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// The largest allocation size seen while armed.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    /// The sum of all allocation sizes seen while armed.
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: never panic inside the allocator, even during thread teardown.
    // Const-initialised `Cell`s need no allocation and no destructor.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
            let _ = TOTAL.try_with(|t| t.set(t.get().saturating_add(size)));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// `note` only reads and writes thread-local `Cell<usize>`/`Cell<bool>` and never
// allocates, so it cannot re-enter the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours, forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours, forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` through this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What a measurement saw.
#[derive(Clone, Copy, Debug)]
pub struct Allocated {
    pub largest: usize,
    // Not every binary that includes this module reads it.
    #[allow(dead_code)]
    pub total: usize,
}

/// Runs `f` and returns its result and what it allocated on this thread.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Allocated) {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    let seen = Allocated {
        largest: LARGEST.with(|l| l.get()),
        total: TOTAL.with(|t| t.get()),
    };
    (out, seen)
}
