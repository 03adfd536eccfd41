//! ARCHITECTURE.md stays true: its two tables ("Crates: the layers") are
//! the rule, and this test holds the code to them. The compiler already
//! refuses a crate that imports one it does not depend on; this checks what
//! the compiler cannot: that each crate depends only on what its row allows
//! (and the agent side on no database at all), that every crate and every
//! top-level module has a row, and that a module's `crate::` imports stay
//! inside its row's list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rows of the markdown table whose header row starts with `| first |`:
/// each row's cells, backticks removed.
fn table(doc: &str, first: &str) -> Vec<Vec<String>> {
    let header = format!("| {first} |");
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(&header));
    assert!(
        lines.next().is_some(),
        "ARCHITECTURE.md has no table whose first column is `{first}`"
    );
    lines
        .skip(1) // |---|---|
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace('`', ""))
                .collect()
        })
        .collect()
}

/// A "may" cell: comma-separated names, empty for none.
fn names(cell: &str) -> BTreeSet<String> {
    cell.split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
        return;
    }
    for entry in std::fs::read_dir(path).unwrap() {
        rust_files(&entry.unwrap().path(), out);
    }
}

/// `crate::name` references outside comments, by first path segment.
fn crate_imports(files: &[PathBuf]) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                let before = rest[..at].chars().last();
                rest = &rest[at + "crate::".len()..];
                // `acs_store::` and `$crate::` are other things.
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                    continue;
                }
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                    found.entry(name).or_insert_with(|| file.clone());
                }
            }
        }
    }
    found
}

/// The `acs-*` and database dependencies a crate's manifest names.
fn manifest_dependencies(dir: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let value: toml::Value = toml::from_str(&manifest).unwrap();
    value
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|deps| {
            deps.keys()
                .filter(|k| k.starts_with("acs-") || *k == "sqlx")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_crate_depends_only_on_what_architecture_md_allows() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let rows = table(&doc, "crate");
    let mut listed = BTreeSet::new();
    for row in &rows {
        let (name, path, may) = (&row[0], &row[1], names(&row[3]));
        listed.insert(path.clone());
        let mut deps = manifest_dependencies(&root().join(path));
        deps.remove("sqlx");
        let extra: Vec<_> = deps.difference(&may).collect();
        assert!(
            extra.is_empty(),
            "{name} depends on {extra:?}, which ARCHITECTURE.md's row for it does not allow \
             (it allows {may:?}): remove the dependency or change the table on purpose"
        );
    }
    let members: BTreeSet<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| format!("crates/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let missing: Vec<_> = members.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "crates without a row in ARCHITECTURE.md: {missing:?}"
    );
    // The agent side never reaches a database, directly or through a crate.
    for lean in ["crates/agent", "crates/wire", "crates/metrics"] {
        let deps = manifest_dependencies(&root().join(lean));
        assert!(
            !deps.contains("sqlx") && !deps.contains("acs-store"),
            "{lean} must not depend on the database: {deps:?}"
        );
    }
}

#[test]
fn every_module_imports_only_what_architecture_md_allows() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let crates: BTreeMap<String, String> = table(&doc, "crate")
        .into_iter()
        .map(|row| (row[0].clone(), row[1].clone()))
        .collect();
    let mut rows: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for row in table(&doc, "module") {
        let (krate, module) = row[0]
            .split_once('/')
            .expect("a module row names crate/module");
        rows.insert((krate.into(), module.into()), names(&row[2]));
    }
    for (krate, path) in &crates {
        let src = root().join(path).join("src");
        let mut modules = BTreeSet::new();
        for entry in std::fs::read_dir(&src).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let module = name.trim_end_matches(".rs").to_string();
            if !["lib", "main"].contains(&module.as_str()) {
                modules.insert(module);
            }
        }
        for module in modules {
            let may = rows
                .get(&(krate.clone(), module.clone()))
                .unwrap_or_else(|| {
                    panic!(
                        "{krate}'s module `{module}` has no row in ARCHITECTURE.md's module table"
                    )
                });
            let mut files = Vec::new();
            for place in [src.join(&module), src.join(format!("{module}.rs"))] {
                if place.exists() {
                    rust_files(&place, &mut files);
                }
            }
            for (import, file) in crate_imports(&files) {
                assert!(
                    import == module || may.contains(&import),
                    "{} imports `crate::{import}`, but ARCHITECTURE.md lets {krate}/{module} \
                     import only {may:?}: move the code to the layer it belongs to, or change \
                     the table on purpose",
                    file.strip_prefix(root()).unwrap().display()
                );
            }
        }
    }
}

/// The longest a function may run, in lines, not counting the lines of raw
/// string literals (SQL text).
const FUNCTION_LINES_MAX: usize = 120;

/// Functions of `text` longer than [`FUNCTION_LINES_MAX`]: (name, first
/// line, lines). A function ends at the first line that closes it at its
/// own indentation (rustfmt's layout).
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let mut words = trimmed.split_whitespace().skip_while(|w| {
            w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(w)
        });
        if words.next() != Some("fn") || line.trim_end().ends_with(';') {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        let (mut code, mut in_raw) = (0, false);
        for body in &lines[at + 1..] {
            if !in_raw && body.trim_end() == close {
                break;
            }
            if in_raw {
                in_raw = !body.contains("\"#");
            } else {
                code += 1;
                if let Some(open) = body.find("r#\"") {
                    in_raw = !body[open + 3..].contains("\"#");
                }
            }
        }
        if code > FUNCTION_LINES_MAX {
            found.push((name, at + 1, code));
        }
    }
    found
}

#[test]
fn no_function_runs_past_120_lines() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        rust_files(&entry.unwrap().path().join("src"), &mut files);
    }
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (name, line, lines) in long_functions(&text) {
            let path = file.strip_prefix(root()).unwrap().display().to_string();
            long.push(format!("{path}:{line} {name} ({lines} lines)"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {FUNCTION_LINES_MAX} lines (SQL raw strings not counted): split each \
         along its steps: {long:#?}"
    );
    // The measure itself: a long function is found, raw SQL is not counted.
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let long_one = format!("fn long() {{\n{}}}\n", body(FUNCTION_LINES_MAX + 1));
    assert_eq!(long_functions(&long_one).len(), 1);
    let sql = format!("fn sql() {{\n{}    r#\"\n{}\"#;\n}}\n", body(100), body(50));
    assert!(
        long_functions(&sql).is_empty(),
        "raw SQL lines are not counted"
    );
}
