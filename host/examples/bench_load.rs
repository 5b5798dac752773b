//! Loader benchmark on SmolLM2-135M (GGUF Q4_1/Q8_0/F32): open + parse,
//! dequantize every tensor to f32, build the tokenizer, encode text.
//! Prints wall-clock figures; no assertions.
//!
//! cargo run [--release] -p hexlora --example bench_load [-- path/to/model.gguf]
use hexlora::model::gguf::Gguf;
use hexlora::model::source::TensorSource;
use hexlora::model::tokenizer::Tokenizer;
use std::time::Instant;

fn main() -> hexlora::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let t = Instant::now();
    let g = Gguf::open(path.as_ref())?;
    println!("open+parse      {:8.2} ms  ({} tensors, {} metadata keys)", ms(t), g.tensor_infos().len(), g.metadata().len());

    let t = Instant::now();
    let (mut bytes, mut values) = (0usize, 0usize);
    for name in g.names() {
        let raw = g.get(&name)?;
        bytes += raw.bytes.len();
        values += raw.to_f32()?.len();
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "dequantize all  {:8.2} ms  ({:.1} M values from {:.1} MB: {:.2} GB/s of f32 out, {} threads)",
        secs * 1e3,
        values as f64 / 1e6,
        bytes as f64 / 1e6,
        values as f64 * 4.0 / secs / 1e9,
        rayon::current_num_threads()
    );

    let t = Instant::now();
    let tok = Tokenizer::from_gguf(&g)?;
    println!("tokenizer build {:8.2} ms  (vocab {})", ms(t), tok.vocab_size());
    let text = "Personal adapters are trained overnight on the phone; no data leaves the device. 12345 é 東京\n".repeat(200);
    let t = Instant::now();
    let ids = tok.encode(&text)?;
    let secs = t.elapsed().as_secs_f64();
    println!("encode          {:8.2} ms  ({} tokens, {:.2} M tokens/s)", secs * 1e3, ids.len(), ids.len() as f64 / secs / 1e6);
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
