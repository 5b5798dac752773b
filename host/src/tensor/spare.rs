//! Large buffers of dropped tensors, kept for the next tensor of the same
//! length whose maker writes every element ([`super::Tensor::to_overwrite`]).
//!
//! Why: a training step makes the same few activation and gradient shapes
//! over and over (every layer, every step), and a new zeroed tensor costs a
//! memset pass over memory the kernel then writes again. Handing those
//! makers a dropped tensor's buffer instead, stale values and all, made the
//! 6-step SmolLM2 run ~3% faster (mean train tok/s ratio over 44
//! interleaved pairs in four runs: 1.019, 1.013, 1.061 and, against never
//! zeroing at all, 1.057 for that; single pairs vary +-10% on this VM).
//! The zeroing was ~3.5% of CPU samples. Peak RSS: 557 -> 559-560 MiB.
//!
//! Memory: what the pool keeps is memory glibc would otherwise keep on
//! its free lists (`runtime::allocator` turns trimming off), but held for
//! one length only, so buffers of lengths a run stops asking for (the
//! next sequence is shorter) would be stranded. Hence a miss for a length
//! not asked for since the pool was last emptied empties it, back to
//! malloc: with fixed shapes that happens only while the first step meets
//! its shapes (later misses are of known lengths and release nothing), and
//! with changing shapes the first buffer of a new shape releases the old
//! ones. [`CAP_BYTES`] bounds the pool besides. Buffers below [`MIN_LEN`]
//! go straight back to malloc: their memset is cheap.
//!
//! Debug builds (the tests) fill a reused buffer with NaN, so a maker that
//! fails to write some element turns the tests' results into NaN instead
//! of silently reading another tensor's values.
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Shortest buffer worth keeping (elements): 128 KB.
const MIN_LEN: usize = 1 << 15;
/// Most bytes the pool holds. A SmolLM2-135M step at sequence length 256
/// drops at most ~176 MB at once (measured: the whole tape at its end), so
/// every buffer of one step is there for the next; with a 24 MB cap a
/// third of the next step's buffers still had to be zeroed.
const CAP_BYTES: usize = 256 << 20;

static POOL: Mutex<Pool> = Mutex::new(Pool { by_len: None, asked: None, bytes: 0, cap: CAP_BYTES });

/// Keeps `v` for reuse if it is large and the pool has room; else frees it.
pub(crate) fn keep(v: Vec<f32>) {
    if v.len() < MIN_LEN {
        return;
    }
    let refused = match POOL.lock() {
        Ok(mut pool) => pool.keep(v),
        Err(_) => Some(v),
    };
    drop(refused); // freed outside the lock
}

/// A kept buffer of exactly `n` elements, stale values (NaN in debug
/// builds), if there is one. A miss for a new length empties the pool
/// (see the module docs).
pub(crate) fn reuse(n: usize) -> Option<Vec<f32>> {
    if n < MIN_LEN {
        return None;
    }
    let (found, released) = POOL.lock().ok()?.take(n);
    drop(released); // freed outside the lock
    let mut v = found?;
    if cfg!(debug_assertions) {
        v.fill(f32::NAN);
    }
    Some(v)
}

/// Buffers by length, `bytes` of them in all, at most `cap`; `asked`: the
/// lengths asked for since the pool was last emptied.
struct Pool {
    by_len: Option<HashMap<usize, Vec<Vec<f32>>>>,
    asked: Option<HashSet<usize>>,
    bytes: usize,
    cap: usize,
}

impl Pool {
    /// Keeps `v`, or hands it back when it would pass the cap (or its
    /// capacity is not its length: its bytes would be miscounted).
    fn keep(&mut self, v: Vec<f32>) -> Option<Vec<f32>> {
        let bytes = 4 * v.capacity();
        if v.len() != v.capacity() || self.bytes + bytes > self.cap {
            return Some(v);
        }
        self.bytes += bytes;
        self.by_len.get_or_insert_with(HashMap::new).entry(v.len()).or_default().push(v);
        None
    }

    /// A buffer of length `n`; on a miss for a length not asked for since
    /// the pool was last emptied, every buffer, for the caller to free.
    fn take(&mut self, n: usize) -> (Option<Vec<f32>>, Vec<Vec<f32>>) {
        let (by_len, asked) = (self.by_len.get_or_insert_with(HashMap::new), self.asked.get_or_insert_with(HashSet::new));
        if let Some(v) = by_len.get_mut(&n).and_then(Vec::pop) {
            self.bytes -= 4 * v.capacity();
            asked.insert(n);
            return (Some(v), Vec::new());
        }
        if !asked.insert(n) {
            return (None, Vec::new());
        }
        asked.clear();
        asked.insert(n);
        self.bytes = 0;
        (None, by_len.drain().flat_map(|(_, list)| list).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(cap: usize) -> Pool {
        Pool { by_len: None, asked: None, bytes: 0, cap }
    }

    #[test]
    fn a_kept_buffer_comes_back_for_its_length_only() {
        let mut p = pool(1 << 20);
        assert!(p.keep(vec![1.0; 1000]).is_none());
        assert!(p.keep(vec![2.0; 1000]).is_none());
        assert_eq!(p.bytes, 8000);
        let (got, released) = p.take(1000);
        assert_eq!((got.map(|v| v.len()), released.len(), p.bytes), (Some(1000), 0, 4000));
        let (got, released) = p.take(1000);
        assert!(got.is_some() && released.is_empty());
        let (got, released) = p.take(1000);
        assert!(got.is_none() && released.is_empty(), "a length served before is a known one: its miss releases nothing");
    }

    #[test]
    fn a_miss_for_a_new_length_empties_the_pool_one_for_a_known_length_does_not() {
        let mut p = pool(1 << 20);
        assert_eq!(p.take(1500).1.len(), 0, "nothing to release yet");
        for _ in 0..4 {
            assert!(p.keep(vec![0.0; 1000]).is_none());
        }
        let (got, released) = p.take(1500);
        assert!(got.is_none() && released.is_empty(), "1500 was asked for before: a known shape, nothing released");
        assert_eq!(p.bytes, 16000);
        let (got, released) = p.take(2000);
        assert!(got.is_none());
        assert_eq!((released.len(), p.bytes), (4, 0), "a new length: the old shapes go back to malloc");
        assert!(p.keep(vec![0.0; 1000]).is_none());
        assert_eq!(p.take(1500).1.len(), 1, "1500 is new again after the pool was emptied");
    }

    #[test]
    fn the_cap_holds() {
        let mut p = pool(10_000);
        assert!(p.keep(vec![0.0; 2000]).is_none());
        assert_eq!(p.keep(vec![0.0; 2000]).map(|v| v.len()), Some(2000), "8000 + 8000 > 10000");
        assert_eq!(p.bytes, 8000);
    }

    /// Whether the buffer is reused cannot be asserted here (another test's
    /// miss on a new length may empty the shared global pool first); what
    /// is asserted is that a debug build never hands out stale values.
    #[test]
    fn to_overwrite_never_shows_a_dropped_tensors_values_in_debug() {
        // A length no other test uses: the global pool is shared by all.
        let n = MIN_LEN + 4099;
        drop(crate::tensor::Tensor::from_vec(&[n], vec![3.0; n]).unwrap());
        let t = crate::tensor::Tensor::to_overwrite(&[n]);
        assert_eq!(t.data.len(), n);
        if cfg!(debug_assertions) {
            assert!(t.data.iter().all(|v| v.is_nan() || *v == 0.0), "reused buffers are NaN, new ones zero");
        }
    }
}
