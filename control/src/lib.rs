//! weft-control
