//! What a commit records about the run that made it, so `--resume` can
//! refuse different inputs and say which differ: `data HASH (N items); `
//! followed by the configuration's `Debug` text (each part a `; `-separated
//! segment). The data are hashed (FNV-1a); the configuration stays readable
//! so a refusal names the fields.

/// FNV-1a over the bytes `feed` passes to its argument.
pub fn hash(feed: impl FnOnce(&mut dyn FnMut(&[u8]))) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    feed(&mut |bytes: &[u8]| bytes.iter().for_each(|&b| h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3)));
    h
}

/// The fingerprint of `items` data items hashing to `data` under the
/// configuration parts `configs` (each printed with `{:?}`).
pub fn make(data: u64, items: usize, configs: &[&dyn std::fmt::Debug]) -> String {
    let mut s = format!("data {data:016x} ({items} items)");
    for c in configs {
        s += &format!("; {c:?}");
    }
    s
}

/// Splits `s` at `sep` where it is outside brackets and quotes.
fn split_top(s: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut quoted, mut escaped, mut start) = (0i32, false, false, 0);
    let mut parts = Vec::new();
    for (i, c) in s.char_indices() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// `Name { body }` -> `body`.
fn struct_body(v: &str) -> Option<&str> {
    let (name, rest) = v.split_once(" { ")?;
    let ident = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    (ident && rest.ends_with('}')).then(|| rest[..rest.len() - 1].trim_end())
}

fn leaves_into(prefix: &str, v: &str, out: &mut Vec<(String, String)>) {
    let v = v.trim();
    match struct_body(v) {
        Some(body) => {
            for field in split_top(body, ',') {
                if let Some((k, val)) = field.trim().split_once(": ") {
                    let path = if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
                    leaves_into(&path, val, out);
                }
            }
        }
        None => out.push((prefix.to_string(), v.to_string())),
    }
}

/// Field paths and values of a fingerprint (`data` for the data part).
fn leaves(fp: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, part) in split_top(fp, ';').into_iter().enumerate() {
        let part = part.trim();
        match part.strip_prefix("data ") {
            Some(d) if i == 0 => out.push(("data".to_string(), d.to_string())),
            // Parts after the first configuration are named by their type.
            _ if i <= 1 => leaves_into("", part, &mut out),
            _ => leaves_into(part.split_once(" {").map_or("extra", |(n, _)| n), part, &mut out),
        }
    }
    out
}

/// What differs between the fingerprint a commit holds and this run's, in
/// words: up to five fields as `field: was A, now B`.
pub fn difference(committed: &str, now: &str) -> String {
    let (a, b) = (leaves(committed), leaves(now));
    if !a.iter().any(|(k, _)| k == "data") {
        return "the commit's record of its inputs is in an older format, so it cannot be compared".into();
    }
    let get = |v: &[(String, String)], k: &str| v.iter().find(|(x, _)| x == k).map(|(_, y)| y.clone());
    let mut seen = std::collections::BTreeSet::new();
    let diffs: Vec<String> = a
        .iter()
        .chain(&b)
        .map(|(k, _)| k)
        .filter(|k| seen.insert(k.as_str()))
        .filter_map(|k| {
            let (x, y) = (get(&a, k), get(&b, k));
            (x != y).then(|| {
                let name = if k == "data" { "the data (hash, items)".to_string() } else { k.clone() };
                format!("{name}: was {}, now {}", x.as_deref().unwrap_or("absent"), y.as_deref().unwrap_or("absent"))
            })
        })
        .collect();
    match diffs.len() {
        0 => "nothing that can be named (the same fields, a different order)".into(),
        n if n > 5 => format!("{} and {} more", diffs[..5].join("; "), n - 5),
        _ => diffs.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Read only through Debug.
    #[allow(dead_code)]
    #[derive(Debug)]
    struct Lora {
        r: usize,
        targets: Vec<String>,
    }

    #[allow(dead_code)]
    #[derive(Debug)]
    struct Config {
        lora: Lora,
        lr: f32,
        init: Option<String>,
    }

    fn fp(data: u64, r: usize, lr: f32, init: Option<&str>) -> String {
        let c = Config { lora: Lora { r, targets: vec!["q_proj".into(), "v_proj".into()] }, lr, init: init.map(String::from) };
        make(data, 3, &[&c])
    }

    #[test]
    fn a_refusal_names_the_fields_that_differ() {
        assert_eq!(difference(&fp(1, 8, 1e-3, None), &fp(1, 16, 1e-3, None)), "lora.r: was 8, now 16");
        assert_eq!(difference(&fp(1, 8, 1e-3, None), &fp(1, 8, 2e-3, Some("a, {b}"))), "lr: was 0.001, now 0.002; init: was None, now Some(\"a, {b}\")");
        let d = difference(&fp(1, 8, 1e-3, None), &fp(2, 8, 1e-3, None));
        assert!(d.starts_with("the data (hash, items): was 0000000000000001 (3 items), now 0000000000000002 (3 items)"), "{d}");
        assert!(difference("0123456789abcdef", &fp(1, 8, 1e-3, None)).contains("older format"));
        let with_extra = format!("{}; Mezo {{ eps: 0.001 }}", fp(1, 8, 1e-3, None));
        assert_eq!(difference(&with_extra, &format!("{}; Mezo {{ eps: 0.01 }}", fp(1, 8, 1e-3, None))), "Mezo.eps: was 0.001, now 0.01");
    }
}
