//! Model weights: the file format ([`model`]), the forward step ([`forward`]), files for tests
//! and benches ([`make`]) and sharing one base between processes ([`share`]).

pub mod forward;
pub mod make;
pub mod model;
pub mod share;

pub use model::{Base, Delta, Packed};
