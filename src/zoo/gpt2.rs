//! GPT-2 (placeholder while written).
use crate::{DType, Error, Graph};
/// GPT-2 config.
pub struct Gpt2Config;
impl Gpt2Config { /// small
pub fn gpt2_small() -> Gpt2Config { Gpt2Config } }
/// build
pub fn build(_c: &Gpt2Config, _d: DType) -> Result<Graph, Error> { Err(Error::Unsupported("gpt2".into())) }
