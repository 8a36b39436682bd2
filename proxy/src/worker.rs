//! Which worker thread is running: each worker has its own current-thread runtime and its own
//! upstream connection pools, indexed by this id.

use std::cell::Cell;

thread_local! {
    static ID: Cell<usize> = const { Cell::new(0) };
}

pub fn id() -> usize {
    ID.with(|c| c.get())
}

pub fn set_id(id: usize) {
    ID.with(|c| c.set(id));
}
