//! sinter-passes (issue 4).
