//! Integration tests: one binary, modules per topic.
