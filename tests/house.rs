//! The house reads one way (issue 24): no import circle between the modules of `src/`, and once `src/`
//! is built of stage folders, each stage imports only from itself and the stages below it.
//!
//! Reads the sources as text, with no cluster and no compiler. A module is a file (`src/a/b.rs` and
//! `src/a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the crate root), and its imports are the
//! `crate::` and `super::` paths in its code, `use crate::{..}` groups included: comments (doc links
//! too), string and character literals, and everything from its `#[cfg(test)] mod` on are left out.
//! A path counts as an import of the longest module it names. Not counted: paths to the crate root or
//! to the module itself, and `self::` paths (a module's own children), so a module that re-exports its
//! children while they use its items is no circle. Inline `mod x { .. }` blocks count as their file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module by its path from the crate root, `["hooks", "pool"]`; the root is `[]`.
type Module = Vec<String>;

/// Each module and the modules it imports.
type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// The stages of the house, lowest first: a module in stage N imports only from stages 0..=N.
const STAGES: [&str; 8] = ["api", "cache", "hooks", "write", "engine", "controllers", "ops", "tools"];

/// The folders whose existence says `src/` is built of stages (`hooks/` is older than the stages).
const STAGE_FOLDERS: [&str; 7] = ["api", "cache", "write", "engine", "controllers", "ops", "tools"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

// ---- reading the files --------------------------------------------------------------------------

/// Every `.rs` file under `dir` as (path relative to `dir` with `/` separators, text), in path order.
fn read_tree(dir: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, base: &Path, files: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(base).unwrap().components();
                let relative: Vec<String> = relative.map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                files.push((relative.join("/"), text));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    files.sort();
    files
}

/// The module a file under `src/` defines: `a/b.rs` and `a/b/mod.rs` are `a::b`, `lib.rs` and
/// `main.rs` the root.
fn module_of(relative: &str) -> Module {
    let mut parts: Module = relative.strip_suffix(".rs").unwrap_or(relative).split('/').map(str::to_owned).collect();
    let root_file = parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main");
    if root_file || parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Each module's code (see [`code_of`]); the root's two files make one module.
fn modules_of(files: &[(String, String)]) -> BTreeMap<Module, String> {
    let mut modules: BTreeMap<Module, String> = BTreeMap::new();
    for (path, text) in files {
        let code = modules.entry(module_of(path)).or_default();
        code.push_str(&code_of(text));
        code.push('\n');
    }
    modules
}

// ---- what of a file is code ---------------------------------------------------------------------

/// A file's code outside its tests: comments blanked (doc comments and their links too), string and
/// character literals emptied, and everything from its first `#[cfg(test)] mod .. {` on left out.
fn code_of(text: &str) -> String {
    let code = blank_comments_and_literals(text);
    match test_module_start(&code) {
        Some(at) => code[..at].to_owned(),
        None => code,
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` with every comment replaced by a space and every string or character literal by an empty
/// one (`""`, `' '`), so that nothing in them reads as a path. Lifetimes (`'a`) are kept.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], at(i + 1));
        if c == '/' && next == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            out.push(' ');
        } else if c == '/' && next == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if let Some(end) = raw_string_end(&chars, i) {
            out.push_str("\"\"");
            i = end;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && next == '\\' {
            // An escaped character: skip the quote, the backslash and the escaped character, then to the end.
            i += 3;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else if c == '\'' && at(i + 2) == '\'' {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Where the raw string literal starting at `i` (`r"..."`, `r#"..."#`, `br"..."`) ends, if one does.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let before = |n: usize| i.checked_sub(n).map(|j| chars[j]);
    let starts = chars[i] == 'r'
        && match before(1) {
            Some('b') => !before(2).is_some_and(is_ident_char),
            Some(c) => !is_ident_char(c),
            None => true,
        };
    if !starts {
        return None;
    }
    let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
    let mut j = i + 1 + hashes;
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && chars[j + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// Where the first `#[cfg(test)]` that introduces an inline module (`mod tests {`, `pub mod x {`, with
/// other attributes between) starts in `code`.
fn test_module_start(code: &str) -> Option<usize> {
    code.match_indices("#[cfg(test)]").map(|(at, _)| at).find(|at| {
        let mut c = Cursor { code, at: at + "#[cfg(test)]".len() };
        while c.eat("#[") {
            let Some(end) = code[c.at..].find(']') else { return false };
            c.at += end + 1;
        }
        if c.keyword("pub") && c.eat("(") {
            let Some(end) = code[c.at..].find(')') else { return false };
            c.at += end + 1;
        }
        c.keyword("mod") && c.ident().is_some() && c.eat("{")
    })
}

/// A position in code, read token by token (white space skipped).
struct Cursor<'a> {
    code: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn skip_space(&mut self) {
        let rest = &self.code[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Moves past `token` if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let found = self.code[self.at..].starts_with(token);
        if found {
            self.at += token.len();
        }
        found
    }

    /// The identifier that comes next, moved past.
    fn ident(&mut self) -> Option<&'a str> {
        self.skip_space();
        let rest = &self.code[self.at..];
        let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
        if len == 0 || rest.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.at += len;
        Some(&rest[..len])
    }

    /// Moves past the identifier `word` if it comes next (and not merely a longer one starting with it).
    fn keyword(&mut self, word: &str) -> bool {
        let before = self.at;
        if self.ident() == Some(word) {
            return true;
        }
        self.at = before;
        false
    }
}

// ---- imports --------------------------------------------------------------------------------------

/// The paths that start at `crate::` or `super::` in `module`'s code, each as the full path from the
/// root it names (`crate::a::B` → `[a, B]`; `use crate::{a::B, c}` → `[a, B]` and `[c]`).
fn paths(module: &[String], code: &str) -> Vec<Module> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = code[at..].find(is_ident_char) {
        let start = at + offset;
        at = code[start..].find(|c: char| !is_ident_char(c)).map_or(code.len(), |len| start + len);
        let word = &code[start..at];
        let leads = !code[..start].trim_end().ends_with("::") && code[at..].trim_start().starts_with("::");
        if (word == "crate" || word == "super") && leads {
            let mut c = Cursor { code, at: start };
            tree(&mut c, module.to_vec(), &mut found);
            at = at.max(c.at);
        }
    }
    found
}

/// Reads one use tree (or expression path) from `c`, on top of `prefix`, into `found`.
fn tree(c: &mut Cursor<'_>, mut prefix: Module, found: &mut Vec<Module>) {
    loop {
        if c.eat("{") {
            while !c.eat("}") {
                tree(c, prefix.clone(), found);
                if !c.eat(",") {
                    c.eat("}");
                    return;
                }
            }
            return;
        }
        match c.ident() {
            Some("crate") => prefix.clear(),
            Some("super") => {
                prefix.pop();
            }
            Some("self") => {}
            Some(name) => prefix.push(name.to_owned()),
            None => {
                c.eat("*");
                found.push(prefix);
                return;
            }
        }
        if !c.eat("::") {
            if c.keyword("as") {
                c.ident();
            }
            found.push(prefix);
            return;
        }
    }
}

/// The longest module `path` names, if any but the root.
fn resolve(path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    (1..=path.len()).rev().map(|n| &path[..n]).find(|p| modules.contains(*p)).map(<[String]>::to_vec)
}

/// Each module and the other modules it imports.
fn import_graph(modules: &BTreeMap<Module, String>) -> Graph {
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, code)| {
            let imports = paths(module, code)
                .iter()
                .filter_map(|path| resolve(path, &known))
                .filter(|target| target != module)
                .collect();
            (module.clone(), imports)
        })
        .collect()
}

// ---- circles and layers ---------------------------------------------------------------------------

fn name(module: &[String]) -> String {
    if module.is_empty() { "crate".to_owned() } else { module.join("::") }
}

/// The circles of `graph`: its strongly connected components of more than one module (Tarjan), each
/// sorted, in order.
fn circles(graph: &Graph) -> Vec<Vec<Module>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on_stack: BTreeSet<&'g Module>,
        circles: Vec<Vec<Module>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let graph = self.graph;
            for w in graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.circles.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        circles: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v) {
            tarjan.visit(v);
        }
    }
    tarjan.circles.sort();
    tarjan.circles
}

/// "circle of N: a, b, c" for each circle.
fn describe(circles: &[Vec<Module>]) -> Vec<String> {
    circles
        .iter()
        .map(|c| format!("circle of {}: {}", c.len(), c.iter().map(|m| name(m)).collect::<Vec<_>>().join(", ")))
        .collect()
}

/// The stage of a module: that of its top folder, `None` for the root and modules in no stage.
fn stage(module: &[String]) -> Option<usize> {
    STAGES.iter().position(|s| module.first().is_some_and(|m| m == s))
}

/// Every import from a stage of a module above it. The root and modules in no stage stand above every
/// stage: they may import anything, and no stage may import them.
fn upward_imports(graph: &Graph) -> Vec<String> {
    let mut upward = Vec::new();
    for (module, imports) in graph {
        let Some(from) = stage(module) else { continue };
        for target in imports {
            match stage(target) {
                Some(to) if to <= from => {}
                Some(to) => upward.push(format!(
                    "{} ({}, stage {from}) imports {} ({}, stage {to})",
                    name(module),
                    STAGES[from],
                    name(target),
                    STAGES[to]
                )),
                None => upward.push(format!(
                    "{} ({}, stage {from}) imports {}, which is in no stage",
                    name(module),
                    STAGES[from],
                    name(target)
                )),
            }
        }
    }
    upward
}

// ---- the checks -------------------------------------------------------------------------------------

/// The import graph of `src/`, checked to have been read at all (so that no check passes on nothing).
fn src_graph() -> Graph {
    let graph = import_graph(&modules_of(&read_tree(&src())));
    assert!(graph.len() > 1, "read no modules from {}", src().display());
    assert!(graph.values().any(|imports| !imports.is_empty()), "found no imports in {}", src().display());
    graph
}

#[test]
fn src_has_no_import_circle() {
    let graph = src_graph();
    let circles = describe(&circles(&graph));
    assert!(circles.is_empty(), "import circles between the modules of src/:\n{}", circles.join("\n"));
}

#[test]
fn layers_import_only_downwards() {
    if !STAGE_FOLDERS.iter().any(|folder| src().join(folder).is_dir()) {
        println!("no stage folders yet (src/{{{}}}): nothing to check", STAGE_FOLDERS.join(","));
        return;
    }
    let upward = upward_imports(&src_graph());
    assert!(
        upward.is_empty(),
        "imports against the order {} (the root may import anything):\n{}",
        STAGES.join(" < "),
        upward.join("\n")
    );
}

// ---- the checker's own tests, on made-up modules -------------------------------------------------

/// The import graph of made-up files, by module name.
fn graph_of(files: &[(&str, &str)]) -> Graph {
    let files: Vec<(String, String)> = files.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())).collect();
    import_graph(&modules_of(&files))
}

/// What `module` imports in `graph`, by name.
fn imports_of(graph: &Graph, module: &str) -> Vec<String> {
    let key: Module = if module == "crate" { Vec::new() } else { module.split("::").map(str::to_owned).collect() };
    let imports = graph.get(&key).unwrap_or_else(|| panic!("no module {module} in {graph:?}"));
    imports.iter().map(|m| name(m)).collect()
}

#[test]
fn a_circle_is_reported_with_its_modules() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
        ("a.rs", "use crate::b::Bee;\npub fn g() {}\n"),
        ("b.rs", "pub struct Bee(crate::c::Sea);\n"),
        ("c/mod.rs", "pub struct Sea;\nfn f() { crate::a::g() }\n"),
        ("d.rs", "use crate::a::g;\n"),
    ]);
    assert_eq!(describe(&circles(&graph)), ["circle of 3: a, b, c"], "{graph:?}");
}

#[test]
fn modules_without_a_circle_pass() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\nuse crate::a::A;\n"),
        ("main.rs", "fn main() { metahook::run() }\n"),
        ("a.rs", "use crate::b::B;\nuse crate::c::C;\npub struct A(B, C);\n"),
        ("b.rs", "use crate::c::C;\npub struct B(C);\nfn f() -> crate::Root { todo!() }\n"),
        ("c.rs", "pub struct C;\n"),
    ]);
    assert_eq!(imports_of(&graph, "crate"), ["a"]);
    assert_eq!(imports_of(&graph, "a"), ["b", "c"]);
    assert_eq!(imports_of(&graph, "b"), ["c"], "paths to the root are not imports");
    assert!(circles(&graph).is_empty(), "{:?}", describe(&circles(&graph)));
}

#[test]
fn comments_doc_links_literals_and_test_modules_are_not_imports() {
    let b = r##"
//! Module docs naming [`crate::a::A`].
use crate::c::C; // a real import, then a comment naming crate::a
/// Uses [`crate::a::A`] and [crate::a::A] in its docs.
/* a block comment: crate::a::A /* nested: crate::a */ still a comment: crate::a::A */
pub fn f<'a>(x: &'a str) -> (&'a str, char, char, &'static str, &'static str) {
    (x, '"', '\'', "crate::a::A and \" crate::a::A", r#"crate::a::A "quoted" crate::a"#)
}
#[cfg(test)]
#[allow(unused)]
mod tests {
    use crate::a::A;
}
"##;
    let graph = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a.rs", "use crate::b::f;\npub struct A;\n"),
        ("b.rs", b),
        ("c.rs", "pub struct C;\n#[cfg(test)]\nfn only_in_tests() { crate::a::A; }\n"),
    ]);
    assert_eq!(imports_of(&graph, "b"), ["c"], "only the real import of b counts");
    assert_eq!(imports_of(&graph, "c"), ["a"], "a #[cfg(test)] function is not a test module");
    assert_eq!(describe(&circles(&graph)), ["circle of 3: a, b, c"]);
}

#[test]
fn grouped_and_super_imports_are_seen() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod p;\n"),
        ("a.rs", "use crate::{\n    b::{self, B as Bee},\n    p::q::{Q, *},\n};\n"),
        ("b.rs", "pub struct B;\n"),
        ("c.rs", "use crate::{a, b::B};\n"),
        ("p/mod.rs", "pub mod q;\npub use self::q::Q;\nuse super::c::*;\n"),
        ("p/q.rs", "use super::{super::b::B, P};\npub struct Q(super::super::a::A);\n"),
    ]);
    assert_eq!(imports_of(&graph, "a"), ["b", "p::q"]);
    assert_eq!(imports_of(&graph, "c"), ["a", "b"]);
    assert_eq!(imports_of(&graph, "p"), ["c"], "super:: of p/mod.rs is the root; self:: is not counted");
    assert_eq!(imports_of(&graph, "p::q"), ["a", "b", "p"]);
    assert_eq!(describe(&circles(&graph)), ["circle of 4: a, c, p, p::q"]);
}

#[test]
fn an_import_from_a_higher_stage_is_reported() {
    let graph = graph_of(&[
        ("lib.rs", "pub mod api;\npub mod engine;\npub mod controllers;\npub mod cli;\nuse crate::cli::run;\n"),
        ("api/mod.rs", "pub struct Spec;\n"),
        ("engine/mod.rs", "pub mod sync;\n"),
        ("engine/sync.rs", "use crate::api::Spec;\nuse crate::controllers::Manager;\nuse super::Engine;\n"),
        ("controllers/mod.rs", "use crate::{api::Spec, engine::sync};\nuse crate::cli::Args;\n"),
        ("cli.rs", "use crate::controllers::Manager;\n"),
    ]);
    assert_eq!(
        upward_imports(&graph),
        [
            "controllers (controllers, stage 5) imports cli, which is in no stage",
            "engine::sync (engine, stage 4) imports controllers (controllers, stage 5)",
        ]
    );
}
