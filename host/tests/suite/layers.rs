//! The folders of `host/src` form layers (`docs/ARCHITECTURE.md`): a
//! folder's code, its test modules included, names only folders of lower
//! layers (or its own).
//! This reads the sources and checks every `crate::` path against the table,
//! so an upward import fails here rather than in review.
use std::path::{Path, PathBuf};

/// Layer of each top-level module; a module may use its own and lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("signals", 0),
    ("tensor", 0),
    ("test_skip", 0),
    ("dl_find_object", 0),
    ("base", 1),
    ("projection", 2),
    ("ops", 3),
    ("lora", 4),
    ("optim", 4),
    ("autograd", 5),
    ("npu", 5),
    ("model", 6),
    ("train", 7),
    ("runtime", 8),
    ("eval", 9),
    ("personal", 9),
    ("hyper", 10),
    ("serve", 11),
    ("bench_support", 11),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's text, comment lines dropped.
fn code_of(text: &str) -> String {
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

#[test]
fn no_folder_of_host_src_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs").to_string();
        if matches!(top.as_str(), "cli" | "main" | "lib") {
            continue;
        }
        let own = layer(&top).unwrap_or_else(|| panic!("{}: module `{top}` has no layer in LAYERS", rel.display()));
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            match layer(&name) {
                Some(l) if l > own || (l == own && name != top) => {
                    upward.push(format!("{}: crate::{name} (layer {l}) from {top} (layer {own})", rel.display()))
                }
                _ => {}
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(upward.is_empty(), "imports against the layers of docs/ARCHITECTURE.md:\n{}", upward.join("\n"));
}
