//! weft-xds
