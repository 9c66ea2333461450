//! Measuring P2P traffic: one timing engine shared by every test, statistics, the α–β fit.

pub mod fit;
pub mod pattern;
pub mod stats;
