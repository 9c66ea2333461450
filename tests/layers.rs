//! The layer order of `src/` (docs/design.md), kept by a test.
//!
//! Every module of the library (from `src/lib.rs`) and of the binary (from `src/main.rs`) is read
//! with a small tokenizer: comments, doc comments and literals are not code, and `#[cfg(test)]`
//! items (a test module's whole file among them) are left out, so unit tests may import anything.
//! Every path is then resolved to the file that defines what it names: `use` trees (groups, nested
//! groups, renames), paths inline in code, `crate::`, `$crate::` (macros), `self::` and `super::`
//! (relative to the module, inline modules and mod.rs files included), bare paths through a declared
//! child module or through a name a `use` brought in, and re-exports (`pub use`) followed to where
//! the item lives. Two rules hold over those ties between files:
//!
//! 1. a module imports only from its own layer or below ([`LAYERS`], lowest first);
//! 2. no loop between files: no two files import each other, directly or around a chain. A module's
//!    own file naming its descendants (it declares them, re-exports from them) is how Rust builds a
//!    module, and does not count.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::path::Path;

/// The layers, lowest first: each top-level module of `src/` sits in exactly one. A module imports
/// only from its own layer or below. The binary (`main.rs` and `cli/`) is the top layer; `lib.rs`
/// declares the modules and is in none.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "ground",
        &["error", "units", "interrupt", "files", "pattern", "echo"],
    ),
    ("topology", &["topology"]),
    ("backend", &["backend"]),
    ("document", &["document"]),
    ("model", &["model"]),
    ("launch", &["launch"]),
    ("engine", &["engine"]),
    ("bench", &["bench"]),
    ("verbs", &["workload", "doctor", "check"]),
    ("report", &["report"]),
    ("html", &["html"]),
    ("cli", &["cli"]),
];

/// What the binary's files call the library by.
const LIBRARY_NAME: &str = "peerlink";

/// How many names a path may be followed through (`use` renames, re-exports) before giving up.
const MAX_HOPS: usize = 16;

#[test]
fn src_keeps_the_layer_order() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let report = check(&read_tree(&src));
    assert!(
        report.files > 100,
        "the layer test read only {} files of src/",
        report.files
    );
    assert!(report.is_clean(), "{report}");
}

// ---------------------------------------------------------------------------------------------
// Tokens

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ident,
    Punct,
    Literal,
}

#[derive(Clone, Debug)]
struct Token {
    kind: Kind,
    text: String,
    line: usize,
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> char {
        self.chars.get(self.at + ahead).copied().unwrap_or('\0')
    }

    fn done(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn bump(&mut self) -> char {
        let c = self.peek(0);
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        c
    }

    fn bump_while(&mut self, keep: impl Fn(char) -> bool) {
        while !self.done() && keep(self.peek(0)) {
            self.bump();
        }
    }

    fn word(&mut self) -> String {
        let start = self.at;
        if self.peek(0) == '$' {
            self.bump();
        }
        self.bump_while(is_ident_char);
        self.chars[start..self.at].iter().collect()
    }

    /// `/* … */`, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while !self.done() {
            if self.peek(0) == '/' && self.peek(1) == '*' {
                depth += 1;
                self.at += 2;
            } else if self.peek(0) == '*' && self.peek(1) == '/' {
                depth -= 1;
                self.at += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.bump();
            }
        }
    }

    /// A literal from its opening quote to its closing one, escapes skipped.
    fn quoted(&mut self) {
        let quote = self.bump();
        while !self.done() {
            match self.bump() {
                '\\' => {
                    self.bump();
                }
                c if c == quote => return,
                _ => {}
            }
        }
    }

    /// `r"…"`, `r#"…"#` (after the `r`, `br` or `cr`).
    fn raw_string(&mut self) {
        let mut hashes = 0;
        while self.peek(0) == '#' {
            hashes += 1;
            self.bump();
        }
        self.bump();
        while !self.done() {
            if self.bump() == '"' && (0..hashes).all(|k| self.peek(k) == '#') {
                self.at += hashes;
                return;
            }
        }
    }

    fn starts_raw_string(&self) -> bool {
        let hashes = (0..).take_while(|&k| self.peek(k) == '#').count();
        self.peek(hashes) == '"'
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn tokenize(source: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        chars: source.chars().collect(),
        at: 0,
        line: 1,
    };
    let mut tokens = Vec::new();
    while !lexer.done() {
        let line = lexer.line;
        if let Some((kind, text)) = lexer.next_token() {
            tokens.push(Token { kind, text, line });
        }
    }
    tokens
}

impl Lexer {
    /// The next token; none where whitespace or a comment was skipped. A literal's text is left out.
    fn next_token(&mut self) -> Option<(Kind, String)> {
        let c = self.peek(0);
        match c {
            _ if c.is_whitespace() => {
                self.bump();
                return None;
            }
            '/' if self.peek(1) == '/' => {
                self.bump_while(|c| c != '\n');
                return None;
            }
            '/' if self.peek(1) == '*' => {
                self.block_comment();
                return None;
            }
            '"' => self.quoted(),
            // A character ('x', '\n', '"'), else a lifetime or a label ('a).
            '\'' if self.peek(1) == '\\' || self.peek(2) == '\'' => self.quoted(),
            '\'' => {
                self.bump();
                self.bump_while(is_ident_char);
            }
            _ if c.is_ascii_digit() => {
                self.bump_while(is_ident_char);
                while self.peek(0) == '.' && self.peek(1).is_ascii_digit() {
                    self.bump();
                    self.bump_while(is_ident_char);
                }
            }
            _ if c == '$' || is_ident_char(c) => return Some(self.word_or_prefixed_literal()),
            ':' if self.peek(1) == ':' => {
                self.at += 2;
                return Some((Kind::Punct, "::".into()));
            }
            _ => {
                self.bump();
                return Some((Kind::Punct, c.to_string()));
            }
        }
        Some((Kind::Literal, String::new()))
    }

    /// A word (`$crate` and `r#raw` included), or a literal it prefixes: `r"…"`, `b"…"`, `b'x'`, `c"…"`.
    fn word_or_prefixed_literal(&mut self) -> (Kind, String) {
        let word = self.word();
        let next = self.peek(0);
        match word.as_str() {
            "r" if next == '#' && is_ident_char(self.peek(1)) => {
                self.bump();
                return (Kind::Ident, self.word());
            }
            "r" | "br" | "cr" if self.starts_raw_string() => self.raw_string(),
            "b" | "c" if next == '"' => self.quoted(),
            "b" if next == '\'' => self.quoted(),
            _ => return (Kind::Ident, word),
        }
        (Kind::Literal, String::new())
    }
}

fn text(tokens: &[Token], at: usize) -> &str {
    tokens.get(at).map_or("", |token| token.text.as_str())
}

fn is_ident(tokens: &[Token], at: usize) -> bool {
    tokens
        .get(at)
        .is_some_and(|token| token.kind == Kind::Ident)
}

/// The index of the bracket closing the one at `open`.
fn closing(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (k, token) in tokens.iter().enumerate().skip(open) {
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

// ---------------------------------------------------------------------------------------------
// `#[cfg(test)]`: left out

/// A file's tokens without its `#[cfg(test)]` items.
struct Code {
    tokens: Vec<Token>,
    /// The modules declared test-only (`#[cfg(test)] mod tests;`): their files are not checked.
    test_modules: Vec<String>,
    /// `#![cfg(test)]`: the whole file is test code.
    test_only: bool,
}

fn without_tests(tokens: Vec<Token>) -> Code {
    let mut code = Code {
        tokens: Vec::new(),
        test_modules: Vec::new(),
        test_only: false,
    };
    let mut at = 0;
    while at < tokens.len() {
        let inner = text(&tokens, at + 1) == "!";
        let open = at + 1 + usize::from(inner);
        if text(&tokens, at) != "#" || text(&tokens, open) != "[" {
            code.tokens.push(tokens[at].clone());
            at += 1;
            continue;
        }
        let close = closing(&tokens, open);
        if !is_test_cfg(&tokens[open + 1..close]) {
            code.tokens
                .extend_from_slice(&tokens[at..=close.min(tokens.len() - 1)]);
            at = close + 1;
            continue;
        }
        if inner {
            code.test_only = true;
            return code;
        }
        let mut item = close + 1;
        while text(&tokens, item) == "#" && text(&tokens, item + 1) == "[" {
            item = closing(&tokens, item + 1) + 1;
        }
        if let Some(name) = declared_module(&tokens, item) {
            code.test_modules.push(name);
        }
        at = item_end(&tokens, item);
    }
    code
}

/// `cfg(test)`, `cfg(all(test, …))`, `cfg(any(test))`: compiled only for tests.
fn is_test_cfg(attribute: &[Token]) -> bool {
    match attribute {
        [cfg, open, predicate @ .., close] => {
            cfg.text == "cfg"
                && open.text == "("
                && close.text == ")"
                && is_test_predicate(predicate)
        }
        _ => false,
    }
}

fn is_test_predicate(predicate: &[Token]) -> bool {
    match predicate {
        [word] => word.text == "test",
        [word, open, arguments @ .., close] if open.text == "(" && close.text == ")" => {
            let arguments = split_commas(arguments);
            match word.text.as_str() {
                "all" => arguments.iter().any(|a| is_test_predicate(a)),
                "any" => !arguments.is_empty() && arguments.iter().all(|a| is_test_predicate(a)),
                _ => false,
            }
        }
        _ => false,
    }
}

fn split_commas(tokens: &[Token]) -> Vec<&[Token]> {
    let (mut parts, mut start, mut depth) = (Vec::new(), 0, 0);
    for (k, token) in tokens.iter().enumerate() {
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    parts.retain(|part| !part.is_empty());
    parts
}

/// `[pub[(…)]] mod name;` at `at`: the name.
fn declared_module(tokens: &[Token], mut at: usize) -> Option<String> {
    if text(tokens, at) == "pub" {
        at += 1;
        if text(tokens, at) == "(" {
            at = closing(tokens, at) + 1;
        }
    }
    (text(tokens, at) == "mod" && is_ident(tokens, at + 1) && text(tokens, at + 2) == ";")
        .then(|| tokens[at + 1].text.clone())
}

/// Where the item (or field, or match arm) starting at `at` ends: after its `;` or `,`, after its
/// block, or before the bracket closing what holds it.
fn item_end(tokens: &[Token], mut at: usize) -> usize {
    let mut depth = 0;
    while at < tokens.len() {
        match text(tokens, at) {
            "{" if depth == 0 => return closing(tokens, at) + 1,
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" if depth == 0 => return at,
            ")" | "]" | "}" => depth -= 1,
            ";" | "," if depth == 0 => return at + 1,
            _ => {}
        }
        at += 1;
    }
    at
}

// ---------------------------------------------------------------------------------------------
// What a file names

/// A path as written, in the (inline) module it is written in, relative to the file's module.
#[derive(Clone, Debug)]
struct Mention {
    within: Vec<String>,
    segments: Vec<String>,
    line: usize,
}

/// One leaf of a `use` tree: the full path and the name it brings in (none for `*` and `_`).
struct UseLeaf {
    mention: Mention,
    name: Option<String>,
}

#[derive(Default)]
struct Scan {
    /// `mod name;` (relative to the file's module, through inline modules).
    declared: Vec<Vec<String>>,
    /// `mod name { … }`.
    inline: Vec<Vec<String>>,
    uses: Vec<UseLeaf>,
    mentions: Vec<Mention>,
}

fn scan(tokens: &[Token]) -> Scan {
    let mut scan = Scan::default();
    let mut open: Vec<(String, usize)> = Vec::new(); // inline modules: name, brace depth inside
    let mut depth = 0;
    let mut at = 0;
    while at < tokens.len() {
        let within: Vec<String> = open.iter().map(|(name, _)| name.clone()).collect();
        match text(tokens, at) {
            "{" => depth += 1,
            "}" => {
                if open.last().is_some_and(|&(_, inside)| inside == depth) {
                    open.pop();
                }
                depth -= 1;
            }
            "mod" if is_ident(tokens, at + 1) => {
                let path = [within, vec![tokens[at + 1].text.clone()]].concat();
                match text(tokens, at + 2) {
                    ";" => scan.declared.push(path),
                    "{" => {
                        scan.inline.push(path);
                        depth += 1;
                        open.push((tokens[at + 1].text.clone(), depth));
                        at += 3;
                        continue;
                    }
                    _ => {}
                }
            }
            "use" if is_use_tree_start(tokens, at + 1) => {
                at = use_tree(tokens, at + 1, Vec::new(), &within, &mut scan.uses);
                continue;
            }
            _ if is_ident(tokens, at)
                && text(tokens, at + 1) == "::"
                && (at == 0 || text(tokens, at - 1) != "::") =>
            {
                let line = tokens[at].line;
                let mut segments = vec![tokens[at].text.clone()];
                at += 1;
                while text(tokens, at) == "::" && is_ident(tokens, at + 1) {
                    segments.push(tokens[at + 1].text.clone());
                    at += 2;
                }
                scan.mentions.push(Mention {
                    within,
                    segments,
                    line,
                });
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    scan
}

/// `use` followed by a tree (not `use<'a>`, the bound).
fn is_use_tree_start(tokens: &[Token], at: usize) -> bool {
    is_ident(tokens, at) || matches!(text(tokens, at), "::" | "{" | "*")
}

/// Reads the `use` tree at `at` under `prefix` into `leaves`; returns the index after it.
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    mut prefix: Vec<String>,
    within: &[String],
    leaves: &mut Vec<UseLeaf>,
) -> usize {
    if text(tokens, at) == "::" {
        prefix.push("::".into()); // `use ::name`: another crate
        at += 1;
    }
    loop {
        let line = tokens.get(at).map_or(0, |token| token.line);
        let leaf = |segments: Vec<String>, name: Option<String>| UseLeaf {
            mention: Mention {
                within: within.to_vec(),
                segments,
                line,
            },
            name,
        };
        match text(tokens, at) {
            "{" => {
                at += 1;
                while !matches!(text(tokens, at), "}" | "") {
                    let next = use_tree(tokens, at, prefix.clone(), within, leaves);
                    at = if text(tokens, next) == "," {
                        next + 1
                    } else {
                        next.max(at + 1)
                    };
                }
                return at + 1;
            }
            "*" => {
                leaves.push(leaf(prefix, None));
                return at + 1;
            }
            _ if is_ident(tokens, at) => {
                let word = tokens[at].text.clone();
                at += 1;
                if text(tokens, at) == "::" {
                    prefix.push(word);
                    at += 1;
                    continue;
                }
                let mut name = Some(word.clone());
                if text(tokens, at) == "as" {
                    name = Some(text(tokens, at + 1).to_string());
                    at += 2;
                }
                if word == "self" && !prefix.is_empty() {
                    if name.as_deref() == Some("self") {
                        name = prefix.last().cloned();
                    }
                } else {
                    prefix.push(word);
                }
                leaves.push(leaf(prefix, name.filter(|name| name != "_")));
                return at;
            }
            _ => return at,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The crates' modules

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Crate {
    Library,
    Binary,
}

const ROOTS: [(Crate, &str); 2] = [(Crate::Library, "lib.rs"), (Crate::Binary, "main.rs")];

type ModulePath = (Crate, Vec<String>);

struct Module {
    file: String,
    /// The module of the file itself (an inline module shares its file).
    file_module: Vec<String>,
    children: BTreeSet<String>,
    /// The names `use` brings in, and the path each stands for (as written here).
    names: HashMap<String, Vec<String>>,
}

#[derive(Default)]
struct Tree {
    modules: BTreeMap<ModulePath, Module>,
    mentions: Vec<(ModulePath, Mention)>,
    /// Files that hold test code only.
    test_files: BTreeSet<String>,
    problems: Vec<String>,
}

impl Tree {
    fn read(files: &BTreeMap<String, String>) -> Tree {
        let mut tree = Tree::default();
        for (krate, root) in ROOTS {
            if files.contains_key(root) {
                tree.load(files, root, krate, Vec::new(), false);
            }
        }
        tree
    }

    fn load(
        &mut self,
        files: &BTreeMap<String, String>,
        file: &str,
        krate: Crate,
        path: Vec<String>,
        test: bool,
    ) {
        let code = without_tests(tokenize(&files[file]));
        let test = test || code.test_only;
        let scan = scan(&code.tokens);
        let dir = match file.rsplit_once('/') {
            _ if ["lib.rs", "main.rs"].contains(&file) => String::new(),
            Some((dir, "mod.rs")) => format!("{dir}/"),
            _ => format!("{}/", file.trim_end_matches(".rs")),
        };
        let declared = scan.declared.iter().map(|child| (child.clone(), test));
        let test_declared = code
            .test_modules
            .iter()
            .map(|name| (vec![name.clone()], true));
        let children: Vec<_> = declared.chain(test_declared).collect();
        if test {
            self.test_files.insert(file.to_string());
        } else {
            self.register(file, krate, &path, &scan);
        }
        for (child, test) in children {
            let stem = format!("{dir}{}", child.join("/"));
            let Some(child_file) = [format!("{stem}.rs"), format!("{stem}/mod.rs")]
                .into_iter()
                .find(|f| files.contains_key(f))
            else {
                self.problems.push(format!(
                    "src/{file}: `mod {}` has no file the layer test can find",
                    child.join("::")
                ));
                continue;
            };
            self.load(
                files,
                &child_file,
                krate,
                [path.clone(), child].concat(),
                test,
            );
        }
    }

    fn register(&mut self, file: &str, krate: Crate, path: &[String], scan: &Scan) {
        let new = || Module {
            file: file.to_string(),
            file_module: path.to_vec(),
            children: BTreeSet::new(),
            names: HashMap::new(),
        };
        self.modules.insert((krate, path.to_vec()), new());
        for inline in &scan.inline {
            self.modules.insert((krate, [path, inline].concat()), new());
        }
        for child in scan.declared.iter().chain(&scan.inline) {
            let (name, parent) = child.split_last().expect("a module has a name");
            if let Some(module) = self.modules.get_mut(&(krate, [path, parent].concat())) {
                module.children.insert(name.clone());
            }
        }
        for leaf in &scan.uses {
            let within = (krate, [path, &leaf.mention.within].concat());
            if let (Some(name), Some(module)) = (&leaf.name, self.modules.get_mut(&within)) {
                if leaf.mention.segments.len() > 1 {
                    module
                        .names
                        .insert(name.clone(), leaf.mention.segments.clone());
                }
            }
        }
        let mentions = scan
            .uses
            .iter()
            .map(|leaf| &leaf.mention)
            .chain(&scan.mentions);
        for mention in mentions {
            self.mentions
                .push(((krate, [path, &mention.within].concat()), mention.clone()));
        }
    }

    /// The crate and path from its root that `segments`, written in module `from`, stand for; none
    /// for another crate's path (std, serde) or a name the test cannot follow.
    fn absolute(&self, from: &ModulePath, segments: &[String], hops: usize) -> Option<ModulePath> {
        let (krate, here) = from;
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" | "$crate" => (*krate, Vec::new()),
            LIBRARY_NAME if *krate == Crate::Binary => (Crate::Library, Vec::new()),
            "self" => from.clone(),
            "super" => (*krate, here[..here.len().saturating_sub(1)].to_vec()),
            name => {
                let module = self.modules.get(from)?;
                if module.children.contains(name) {
                    (*krate, [here.clone(), vec![name.to_string()]].concat())
                } else if hops < MAX_HOPS {
                    let named = module.names.get(name)?;
                    return self.absolute(from, &[named, rest].concat(), hops + 1);
                } else {
                    return None;
                }
            }
        };
        for segment in rest {
            match segment.as_str() {
                "super" => {
                    base.1.pop();
                }
                "self" => {}
                _ => base.1.push(segment.clone()),
            }
        }
        Some(base)
    }

    /// The modules a path passes through to what it names: the longest module prefix, then, where
    /// that module's `use` items bring the name in (a re-export), on to where the item lives. The
    /// file naming the path depends on each of them.
    fn passes_through(&self, path: &ModulePath, hops: usize) -> Vec<(&ModulePath, &Module)> {
        let (krate, segments) = path;
        let Some(length) = (0..=segments.len())
            .rev()
            .find(|&n| self.modules.contains_key(&(*krate, segments[..n].to_vec())))
        else {
            return Vec::new();
        };
        let found = self
            .modules
            .get_key_value(&(*krate, segments[..length].to_vec()))
            .expect("found above");
        let rest = &segments[length..];
        let mut through = vec![found];
        if let Some(named) = rest
            .first()
            .and_then(|name| found.1.names.get(name))
            .filter(|_| hops < MAX_HOPS)
        {
            if let Some(next) = self.absolute(found.0, &[named, &rest[1..]].concat(), hops + 1) {
                through.extend(self.passes_through(&next, hops + 1));
            }
        }
        through
    }
}

// ---------------------------------------------------------------------------------------------
// The rules

/// Where a file names another: its line and the path as written.
#[derive(Clone, Debug)]
struct Place {
    line: usize,
    path: String,
}

/// The ties between files: from → to → where.
type Ties = BTreeMap<String, BTreeMap<String, Vec<Place>>>;

/// A module's top-level module and the rank of its layer in [`LAYERS`]; `Ok(None)` for the
/// library's root (in no layer); `Err(top)` for a top-level module no layer holds.
fn layer(krate: Crate, module: &[String]) -> Result<Option<(String, usize)>, String> {
    let top = match (krate, module.first()) {
        (Crate::Binary, _) => "cli",
        (Crate::Library, None) => return Ok(None),
        (Crate::Library, Some(top)) => top.as_str(),
    };
    let rank = LAYERS
        .iter()
        .position(|(_, members)| members.contains(&top));
    rank.map(|rank| Some((top.to_string(), rank)))
        .ok_or_else(|| top.to_string())
}

/// `ground (error, units, …) → topology → …`
fn written_order() -> String {
    let layers = LAYERS.iter().map(|(name, members)| match members {
        [only] if only == name => name.to_string(),
        _ => format!("{name} ({})", members.join(", ")),
    });
    layers.collect::<Vec<_>>().join(" → ")
}

struct Upward {
    from: String,
    to: String,
    from_top: String,
    to_top: String,
    places: Vec<Place>,
}

struct Report {
    files: usize,
    upward: Vec<Upward>,
    /// Each a chain of files, the first repeated at its end, with where each names the next.
    loops: Vec<Vec<(String, Vec<Place>)>>,
    /// Sets of files tied in a loop (the chains cover every tie inside each).
    tangles: usize,
    /// Top-level modules in no layer, files no module declares, names of the library's root.
    problems: Vec<String>,
}

/// Each checked file's crate and module.
type FileModules = BTreeMap<String, (Crate, Vec<String>)>;

fn check(files: &BTreeMap<String, String>) -> Report {
    let tree = Tree::read(files);
    let mut file_modules = FileModules::new();
    for ((krate, _), module) in &tree.modules {
        let entry = file_modules.entry(module.file.clone());
        entry.or_insert((*krate, module.file_module.clone()));
    }
    let (ties, mut problems) = tree.ties();
    problems.extend(unplaced_and_undeclared(files, &tree, &file_modules));
    let tangles = tangles(&ties);
    let loops = tangles
        .iter()
        .flat_map(|tangle| chains(&ties, tangle))
        .collect();
    Report {
        files: file_modules.len(),
        upward: upward_ties(&ties, &file_modules),
        loops,
        tangles: tangles.len(),
        problems,
    }
}

impl Tree {
    /// Which file names which, and where; and the names of items of `lib.rs`.
    fn ties(&self) -> (Ties, Vec<String>) {
        let (mut ties, mut problems) = (Ties::new(), Vec::new());
        for (from, mention) in &self.mentions {
            let module = &self.modules[from];
            let Some(target) = self.absolute(from, &mention.segments, 0) else {
                continue;
            };
            let path = mention.segments.join("::");
            let through = self.passes_through(&target, 0);
            let is_library_root =
                |(krate, path): &ModulePath| *krate == Crate::Library && path.is_empty();
            if through.last().is_some_and(|(to, _)| is_library_root(to)) {
                problems.push(format!(
                    "src/{}:{}: `{path}` names an item of src/lib.rs, which declares modules only",
                    module.file, mention.line
                ));
            }
            for (to_path, to) in through {
                let own_descendant = to_path.0 == from.0
                    && to_path.1.len() > module.file_module.len()
                    && to_path.1.starts_with(&module.file_module);
                if to.file == module.file || own_descendant || is_library_root(to_path) {
                    continue;
                }
                let places = ties
                    .entry(module.file.clone())
                    .or_default()
                    .entry(to.file.clone());
                places.or_default().push(Place {
                    line: mention.line,
                    path: path.clone(),
                });
            }
        }
        (ties, problems)
    }
}

/// Top-level modules in no layer, and files of `src/` that no `mod` declares.
fn unplaced_and_undeclared(
    files: &BTreeMap<String, String>,
    tree: &Tree,
    file_modules: &FileModules,
) -> Vec<String> {
    let unplaced: BTreeSet<(String, &String)> = file_modules
        .iter()
        .filter_map(|(file, (krate, module))| layer(*krate, module).err().map(|top| (top, file)))
        .collect();
    let unplaced = unplaced.into_iter().map(|(top, file)| {
        format!("src/{file}: module `{top}` is in no layer: place it in LAYERS (tests/layers.rs) and docs/design.md")
    });
    let undeclared = files
        .keys()
        .filter(|file| !file_modules.contains_key(*file) && !tree.test_files.contains(*file))
        .map(|file| {
            format!("src/{file}: no `mod` declares this file, so the layer test does not see it")
        });
    unplaced.chain(undeclared).collect()
}

/// The ties from a file to a file of a higher layer.
fn upward_ties(ties: &Ties, file_modules: &FileModules) -> Vec<Upward> {
    let rank = |file: &String| {
        layer(file_modules[file].0, &file_modules[file].1)
            .ok()
            .flatten()
    };
    let mut upward = Vec::new();
    for (from, targets) in ties {
        for (to, places) in targets {
            let (Some((from_top, from_rank)), Some((to_top, to_rank))) = (rank(from), rank(to))
            else {
                continue;
            };
            if to_rank > from_rank {
                let (from, to, places) = (from.clone(), to.clone(), places.clone());
                upward.push(Upward {
                    from,
                    to,
                    from_top,
                    to_top,
                    places,
                });
            }
        }
    }
    upward
}

/// The strongly connected sets of more than one file (Tarjan's algorithm).
fn tangles(ties: &Ties) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        ties: &'a Ties,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(walk: &mut Walk<'a>, file: &'a str) {
        let n = walk.index.len();
        walk.index.insert(file, n);
        walk.low.insert(file, n);
        walk.stack.push(file);
        for next in walk
            .ties
            .get(file)
            .into_iter()
            .flat_map(|targets| targets.keys())
        {
            if !walk.index.contains_key(next.as_str()) {
                visit(walk, next);
                walk.low
                    .insert(file, walk.low[file].min(walk.low[next.as_str()]));
            } else if walk.stack.contains(&next.as_str()) {
                walk.low
                    .insert(file, walk.low[file].min(walk.index[next.as_str()]));
            }
        }
        if walk.low[file] == walk.index[file] {
            let at = walk
                .stack
                .iter()
                .rposition(|&f| f == file)
                .expect("on the stack");
            let set: BTreeSet<String> = walk.stack.drain(at..).map(str::to_string).collect();
            if set.len() > 1 {
                walk.found.push(set);
            }
        }
    }
    let mut walk = Walk {
        ties,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for file in ties.keys() {
        if !walk.index.contains_key(file.as_str()) {
            visit(&mut walk, file);
        }
    }
    walk.found
}

/// Loops through a tangle as chains of files, until every tie inside it is in one.
fn chains(ties: &Ties, tangle: &BTreeSet<String>) -> Vec<Vec<(String, Vec<Place>)>> {
    let inside = |from: &String| {
        ties.get(from)
            .into_iter()
            .flat_map(|targets| targets.keys())
            .filter(|to| tangle.contains(*to))
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut chains = Vec::new();
    for from in tangle {
        for to in inside(from) {
            if covered.contains(&(from.clone(), to.clone())) {
                continue;
            }
            // The shortest way back from `to` to `from`, inside the tangle.
            let mut came_from: BTreeMap<String, String> = BTreeMap::new();
            let mut queue = VecDeque::from([to.clone()]);
            while let Some(file) = queue.pop_front() {
                if file == *from {
                    break;
                }
                for next in inside(&file) {
                    if next != to && !came_from.contains_key(&next) {
                        came_from.insert(next.clone(), file.clone());
                        queue.push_back(next);
                    }
                }
            }
            let mut files = vec![from.clone()];
            while let Some(previous) = files
                .last()
                .and_then(|file| came_from.get(file))
                .filter(|_| files.len() <= tangle.len())
            {
                files.push(previous.clone());
            }
            files.push(from.clone());
            files.reverse();
            let chain: Vec<_> = files
                .windows(2)
                .map(|pair| {
                    covered.insert((pair[0].clone(), pair[1].clone()));
                    (pair[0].clone(), ties[&pair[0]][&pair[1]].clone())
                })
                .chain([(from.clone(), Vec::new())])
                .collect();
            chains.push(chain);
        }
    }
    chains
}

impl Report {
    fn is_clean(&self) -> bool {
        self.upward.is_empty() && self.loops.is_empty() && self.problems.is_empty()
    }
}

/// `src/a.rs:12 `crate::b::c`` and, where the file names the same file again, the other lines.
fn places(file: &str, places: &[Place]) -> String {
    let first = &places[0];
    let mut text = format!("src/{file}:{} `{}`", first.line, first.path);
    if places.len() > 1 {
        let more: Vec<String> = places[1..]
            .iter()
            .map(|place| format!("{} `{}`", place.line, place.path))
            .collect();
        text += &format!(" (and lines {})", more.join(", "));
    }
    text
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(
            f,
            "the layer order of src/ is broken (docs/design.md; the order is LAYERS in tests/layers.rs): \
             {} upward imports between files, {} loops ({} chains), {} other problems",
            self.upward.len(),
            self.tangles,
            self.loops.len(),
            self.problems.len()
        )?;
        if !self.upward.is_empty() {
            writeln!(
                f,
                "\nrule 1, a module imports only from its own layer or below: {}",
                written_order()
            )?;
        }
        for upward in &self.upward {
            writeln!(
                f,
                "  {}: {} imports from {}, a layer above it (src/{})",
                places(&upward.from, &upward.places),
                upward.from_top,
                upward.to_top,
                upward.to
            )?;
        }
        if !self.loops.is_empty() {
            writeln!(f, "\nrule 2, no loop between files (a module's own file naming its children excepted):")?;
        }
        for chain in &self.loops {
            let files: Vec<String> = chain
                .iter()
                .map(|(file, _)| format!("src/{file}"))
                .collect();
            writeln!(f, "  loop: {}", files.join(" → "))?;
            for (file, tie) in chain.iter().filter(|(_, tie)| !tie.is_empty()) {
                writeln!(f, "    {}", places(file, tie))?;
            }
        }
        if !self.problems.is_empty() {
            writeln!(f, "\nother problems:")?;
        }
        for problem in &self.problems {
            writeln!(f, "  {problem}")?;
        }
        Ok(())
    }
}

/// Every `.rs` file under `src`, by its path from there (`/`-separated).
fn read_tree(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, files: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("src/ is readable").path();
            if path.is_dir() {
                walk(&path, src, files);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(src).expect("under src/");
                let name = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                files.insert(
                    name,
                    std::fs::read_to_string(&path).expect("a source file is UTF-8"),
                );
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(src, src, &mut files);
    files
}

// ---------------------------------------------------------------------------------------------
// Each form of path, planted in a small crate, and what is exempt

/// A library of three layers (ground: error; topology; report) and a binary, plus `files`.
fn planted(files: &[(&str, &str)]) -> Report {
    let mut tree: BTreeMap<String, String> = [
        ("lib.rs", "//! The crate.\npub mod error;\npub mod topology;\npub mod report;\npub use error::Error;\n"),
        ("error.rs", "pub struct Error;\n"),
        ("topology/mod.rs", "pub struct Topology;\n"),
        ("report/mod.rs", "pub fn render() {}\npub struct Table { pub rows: usize }\n"),
        ("main.rs", "mod cli;\nfn main() { cli::run() }\n"),
        ("cli/mod.rs", "pub fn run() { peerlink::report::render() }\n"),
    ]
    .into_iter()
    .map(|(path, text)| (path.to_string(), text.to_string()))
    .collect();
    for (path, text) in files {
        tree.insert(path.to_string(), text.to_string());
    }
    check(&tree)
}

/// Each upward import found, as `file:line path → file`, sorted.
fn upward(report: &Report) -> Vec<String> {
    let each = report.upward.iter().flat_map(|up| {
        up.places
            .iter()
            .map(|place| format!("{}:{} {} → {}", up.from, place.line, place.path, up.to))
    });
    let mut each: Vec<String> = each.collect();
    each.sort();
    each
}

/// Each loop, as its chain of files.
fn loops(report: &Report) -> Vec<String> {
    let chain = |chain: &Vec<(String, Vec<Place>)>| {
        chain
            .iter()
            .map(|(file, _)| file.as_str())
            .collect::<Vec<_>>()
            .join(" → ")
    };
    report.loops.iter().map(chain).collect()
}

#[test]
fn a_clean_crate_passes() {
    let report = planted(&[(
        "topology/mod.rs",
        "use crate::error::Error;\npub fn f() -> crate::Error { Error }\n",
    )]);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_use_line_importing_upward_is_named_with_its_file_and_line() {
    let report = planted(&[(
        "topology/mod.rs",
        "//! Devices.\n\nuse crate::report::Table;\n",
    )]);
    assert_eq!(
        upward(&report),
        ["topology/mod.rs:3 crate::report::Table → report/mod.rs"]
    );
    let message = report.to_string();
    assert!(message.contains("src/topology/mod.rs:3 `crate::report::Table`: topology imports from report, a layer above it"), "{message}");
    assert!(
        message
            .contains("rule 1, a module imports only from its own layer or below: ground (error,"),
        "{message}"
    );
}

#[test]
fn use_groups_nested_groups_and_renames_are_followed_to_each_leaf() {
    let report = planted(&[
        ("report/mod.rs", "pub mod export;\npub fn render() {}\n"),
        ("report/export.rs", "pub struct Records;\n"),
        (
            "topology/mod.rs",
            "use crate::{\n    error::Error,\n    report::{self as shown, export::{Records as Rows}},\n};\n",
        ),
    ]);
    assert_eq!(
        upward(&report),
        [
            "topology/mod.rs:3 crate::report → report/mod.rs",
            "topology/mod.rs:3 crate::report::export::Records → report/export.rs"
        ]
    );
}

#[test]
fn paths_inline_in_code_are_seen_calls_struct_literals_and_macros() {
    let code = "pub fn f() -> usize {\n    crate::report::render();\n    let t = crate::report::Table { rows: 1 };\n    \
                crate::report::shout!();\n    t.rows\n}\n";
    let report = planted(&[("topology/mod.rs", code)]);
    assert_eq!(
        upward(&report),
        [
            "topology/mod.rs:2 crate::report::render → report/mod.rs",
            "topology/mod.rs:3 crate::report::Table → report/mod.rs",
            "topology/mod.rs:4 crate::report::shout → report/mod.rs",
        ]
    );
}

#[test]
fn super_and_self_are_relative_to_the_files_module_with_the_mod_rs_rule() {
    let report = planted(&[
        // topology/mod.rs is module `topology`: its `super` is the crate's root.
        (
            "topology/mod.rs",
            "pub mod links;\npub fn f() { super::report::render() }\n",
        ),
        // topology/links.rs is `topology::links`: `super` is `topology`, `super::super` the root.
        (
            "topology/links.rs",
            "use super::Topology;\nuse self::super::super::report::Table;\n",
        ),
    ]);
    assert_eq!(
        upward(&report),
        [
            "topology/links.rs:2 self::super::super::report::Table → report/mod.rs",
            "topology/mod.rs:2 super::report::render → report/mod.rs"
        ]
    );
}

#[test]
fn bare_paths_through_a_declared_child_or_a_used_name_are_followed() {
    let report = planted(&[
        // `links` is a child module; what it re-exports comes from report.
        ("topology/mod.rs", "mod links;\nuse crate::report as shown;\npub fn f() {\n    links::render();\n    shown::render();\n}\n"),
        ("topology/links.rs", "pub(crate) use crate::report::render;\n"),
    ]);
    assert_eq!(
        upward(&report),
        [
            "topology/links.rs:1 crate::report::render → report/mod.rs",
            "topology/mod.rs:2 crate::report → report/mod.rs",
            "topology/mod.rs:4 links::render → report/mod.rs",
            "topology/mod.rs:5 shown::render → report/mod.rs",
        ]
    );
}

#[test]
fn dollar_crate_in_a_macro_is_the_crate() {
    let code = "#[macro_export]\nmacro_rules! draw {\n    () => {\n        $crate::report::render()\n    };\n}\n";
    let report = planted(&[("topology/mod.rs", code)]);
    assert_eq!(
        upward(&report),
        ["topology/mod.rs:4 $crate::report::render → report/mod.rs"]
    );
}

#[test]
fn a_re_export_of_the_crate_root_is_followed_to_where_the_item_lives() {
    let report = planted(&[
        (
            "lib.rs",
            "pub mod error;\npub mod topology;\npub mod report;\npub use report::Table;\n",
        ),
        ("topology/mod.rs", "pub fn f(_: crate::Table) {}\n"),
    ]);
    assert_eq!(
        upward(&report),
        ["topology/mod.rs:1 crate::Table → report/mod.rs"]
    );
}

#[test]
fn inline_modules_have_their_own_super() {
    let code = "mod inner {\n    use super::Topology;\n    use super::super::report::Table;\n}\npub struct Topology;\n";
    let report = planted(&[("topology/mod.rs", code)]);
    assert_eq!(
        upward(&report),
        ["topology/mod.rs:3 super::super::report::Table → report/mod.rs"]
    );
}

#[test]
fn two_files_importing_each_other_are_a_loop_printed_as_a_chain() {
    let report = planted(&[
        ("topology/mod.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("topology/a.rs", "pub struct A;\nuse super::b::B;\n"),
        ("topology/b.rs", "pub struct B;\nuse super::a::A;\n"),
    ]);
    assert_eq!(
        loops(&report),
        ["topology/a.rs → topology/b.rs → topology/a.rs"]
    );
    let message = report.to_string();
    assert!(
        message.contains("loop: src/topology/a.rs → src/topology/b.rs → src/topology/a.rs"),
        "{message}"
    );
    assert!(
        message.contains(
            "    src/topology/a.rs:2 `super::b::B`\n    src/topology/b.rs:2 `super::a::A`"
        ),
        "{message}"
    );
}

#[test]
fn a_loop_around_three_files_is_one_chain() {
    let report = planted(&[
        ("topology/mod.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("topology/a.rs", "pub struct A;\nuse super::b::B;\n"),
        (
            "topology/b.rs",
            "pub struct B;\nuse crate::topology::c::C;\n",
        ),
        (
            "topology/c.rs",
            "pub struct C;\nfn f() -> super::a::A { super::a::A }\n",
        ),
    ]);
    assert_eq!(
        loops(&report),
        ["topology/a.rs → topology/b.rs → topology/c.rs → topology/a.rs"]
    );
}

#[test]
fn a_module_naming_its_children_is_no_loop() {
    let report = planted(&[
        (
            "topology/mod.rs",
            "mod links;\npub use links::Link;\npub struct Topology;\n",
        ),
        (
            "topology/links.rs",
            "pub struct Link;\nuse super::Topology;\n",
        ),
    ]);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn files_of_the_binary_are_the_cli_layer_and_resolve_in_their_own_crate() {
    let report = planted(&[
        (
            "cli/mod.rs",
            "pub mod a;\npub mod b;\npub fn run() { peerlink::report::render() }\n",
        ),
        ("cli/a.rs", "use crate::cli::b;\n"),
        ("cli/b.rs", "use super::a;\n"),
    ]);
    assert!(report.upward.is_empty(), "{report}");
    assert_eq!(loops(&report), ["cli/a.rs → cli/b.rs → cli/a.rs"]);
}

#[test]
fn comments_doc_links_and_literals_are_not_code() {
    let code = r###"//! See [`crate::report::Table`].
/// Renders with [crate::report::render].
/** crate::report::render /* nested crate::report::Table */ crate::report::render */
pub fn f() -> (&'static str, char, char, &'static str) {
    // crate::report::render();
    let quote = '"';
    let raw = r#"crate::report::render() "# ;
    let text = "crate::report::render() \
                and a \" crate::report::Table";
    let bytes = b"crate::report::Table";
    (text, quote, '\'', raw)
}
"###;
    let report = planted(&[("topology/mod.rs", code)]);
    assert!(report.is_clean(), "{report}");
    // And after all of them, code is seen again.
    let report = planted(&[(
        "topology/mod.rs",
        &format!("{code}pub fn g() {{ crate::report::render() }}\n"),
    )]);
    assert_eq!(
        upward(&report),
        ["topology/mod.rs:13 crate::report::render → report/mod.rs"]
    );
}

#[test]
fn cfg_test_items_and_test_module_files_are_exempt() {
    let code = "pub struct Topology;\n\
                #[cfg(test)]\nmod tests;\n\
                #[cfg(test)]\nmod inline_tests {\n    use crate::report::Table;\n}\n\
                #[cfg(all(test, feature = \"html\"))]\nfn helper() { crate::report::render() }\n\
                #[cfg(test)]\n#[allow(dead_code)]\nconst ROWS: [usize; 2] = [crate::report::Table { rows: 1 }.rows; 2];\n";
    let report = planted(&[
        ("topology/mod.rs", code),
        ("topology/tests.rs", "use crate::report::render;\n"),
    ]);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn only_test_only_cfgs_are_exempt() {
    let code = "#[cfg(not(test))]\nfn a() { crate::report::render() }\n\
                #[cfg(any(test, feature = \"html\"))]\nfn b() { crate::report::render() }\n";
    let report = planted(&[("topology/mod.rs", code)]);
    assert_eq!(
        upward(&report),
        [
            "topology/mod.rs:2 crate::report::render → report/mod.rs",
            "topology/mod.rs:4 crate::report::render → report/mod.rs"
        ]
    );
}

#[test]
fn a_module_in_no_layer_and_a_file_no_module_declares_are_problems() {
    let report = planted(&[
        (
            "lib.rs",
            "pub mod error;\npub mod topology;\npub mod report;\npub mod gadgets;\n",
        ),
        ("gadgets.rs", "pub struct Gadget;\n"),
        ("stray.rs", "pub struct Stray;\n"),
    ]);
    let message = report.to_string();
    assert!(
        message.contains("src/gadgets.rs: module `gadgets` is in no layer"),
        "{message}"
    );
    assert!(
        message.contains("src/stray.rs: no `mod` declares this file"),
        "{message}"
    );
}

#[test]
fn an_item_of_lib_rs_is_a_problem() {
    let report = planted(&[
        (
            "lib.rs",
            "pub mod error;\npub mod topology;\npub mod report;\npub fn helper() {}\n",
        ),
        ("topology/mod.rs", "pub fn f() { crate::helper() }\n"),
    ]);
    let message = report.to_string();
    assert!(message.contains("src/topology/mod.rs:1: `crate::helper` names an item of src/lib.rs, which declares modules only"), "{message}");
}

#[test]
fn a_crate_on_disk_is_read_whole() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
        std::fs::write(path, text).expect("a file");
    };
    write(
        "lib.rs",
        "pub mod error;\npub mod topology;\npub mod report;\n",
    );
    write("error.rs", "");
    write("topology/mod.rs", "pub mod links;\n");
    write("topology/links.rs", "use crate::report::render;\n");
    write("report/mod.rs", "pub fn render() {}\n");
    let report = check(&read_tree(dir.path()));
    assert_eq!(report.files, 5);
    assert_eq!(
        upward(&report),
        ["topology/links.rs:1 crate::report::render → report/mod.rs"]
    );
}
