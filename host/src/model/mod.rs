//! Model files, tokenizer and architectures.
pub mod source;
