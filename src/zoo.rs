//! The model zoo.
