//! The guide's code blocks that are not Rust (README.md and `docs/`), checked: the Rust blocks
//! are doctests of the library; here every `sh` block's `replay-guard` command line is parsed
//! by the command's own parser, every `cargo` line's package, profile, features, test,
//! example, bench and fuzz target exists, every script and path it names exists, every
//! environment variable it sets is read by the code, and every `json` and `toml` block parses
//! (an MCP client configuration's `replay-guard` arguments are parsed too). A command of
//! another program (`npx`, `psql`) is not checked.

use std::path::{Path, PathBuf};

use clap::Parser;

use super::Cli;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The pages of the guide: the README and `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The fenced blocks of `text` in `language`, indented or not.
fn blocks(text: &str, language: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.strip_prefix("```") == Some(language) => current = Some(String::new()),
            None => {}
            Some(block) if fence == "```" => {
                found.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(fence);
                block.push('\n');
            }
        }
    }
    found
}

/// The command lines of an `sh` block: continuations joined, comments dropped.
fn command_lines(block: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        let line = strip_comment(line);
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                for command in pending.split("&&") {
                    if !command.trim().is_empty() {
                        lines.push(command.trim().to_owned());
                    }
                }
                pending.clear();
            }
        }
    }
    lines
}

/// `line` without a trailing `# comment` (a `#` inside quotes is kept).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    for (at, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && (at == 0 || line[..at].ends_with(' ')) => {
                return &line[..at];
            }
            _ => {}
        }
    }
    line
}

/// Shell words: quotes removed; the guide's placeholders made concrete.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut single, mut double, mut in_word) = (false, false, false);
    for c in line.chars() {
        match c {
            '\'' if !double => (single, in_word) = (!single, true),
            '"' if !single => (double, in_word) = (!double, true),
            ' ' if !single && !double => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
        .into_iter()
        .map(|word| match word.as_str() {
            "[act_…]" | "act_…" => "act_01J4K8J7DX7VQ9ZB3N5M2P6R8T".to_owned(),
            "SEQ:sha256:HEX" => format!("7:sha256:{}", "ab".repeat(32)),
            _ => word,
        })
        .collect()
}

/// Checks one command line; `Err` says what is wrong with it.
fn check(line: &str) -> Result<(), String> {
    let mut words = words(line);
    // Environment assignments first: each must be a variable the code reads.
    while let Some(first) = words.first() {
        let Some((name, _)) = first.split_once('=') else {
            break;
        };
        if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            break;
        }
        if name != "RUSTDOCFLAGS" && name != "RUSTC_BOOTSTRAP" && !is_read(name) {
            return Err(format!("sets {name}, which no code reads"));
        }
        words.remove(0);
    }
    let Some(program) = words.first().cloned() else {
        return Ok(());
    };
    match program.as_str() {
        "replay-guard" => parse(&words),
        "cargo" => check_cargo(&words[1..]),
        "cd" => exists(&words[1]),
        script if script.ends_with(".sh") => exists(script),
        _ => Ok(()),
    }
}

fn parse(words: &[String]) -> Result<(), String> {
    Cli::try_parse_from(words)
        .map(drop)
        .map_err(|error| error.to_string())
}

fn exists(path: &str) -> Result<(), String> {
    match root().join(path).exists() {
        true => Ok(()),
        false => Err(format!("{path} does not exist")),
    }
}

/// Whether `name` is read by the crate, the command or their tests.
fn is_read(name: &str) -> bool {
    let quoted = format!("\"{name}\"");
    ["src", "cli/src", "cli/tests", "tests", "examples"]
        .iter()
        .any(|dir| contains(&root().join(dir), &quoted))
}

fn contains(dir: &Path, needle: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            contains(&path, needle)
        } else {
            path.extension().is_some_and(|e| e == "rs")
                && std::fs::read_to_string(&path).is_ok_and(|text| text.contains(needle))
        }
    })
}

fn check_cargo(words: &[String]) -> Result<(), String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let manifest: toml::Table = manifest.parse().expect("Cargo.toml parses");
    let features = manifest["features"].as_table().expect("[features]");
    let profiles = manifest["profile"].as_table().expect("[profile]");
    let mut args = words.iter();
    let subcommand = args.next().map(String::as_str);
    if subcommand == Some("fuzz") {
        // cargo fuzz run TARGET, from fuzz/.
        let target = words.get(2).ok_or("cargo fuzz without a target")?;
        return exists(&format!("fuzz/fuzz_targets/{target}.rs"));
    }
    while let Some(arg) = args.next() {
        let mut value = || args.next().cloned().ok_or(format!("{arg} without a value"));
        match arg.as_str() {
            "--" => break,
            "--features" => {
                for feature in value()?.split(',') {
                    if !features.contains_key(feature) {
                        return Err(format!("no feature {feature}"));
                    }
                }
            }
            "--profile" => {
                let profile = value()?;
                if !profiles.contains_key(&profile) {
                    return Err(format!("no profile {profile}"));
                }
            }
            "-p" => {
                let package = value()?;
                if package != "mcp-replay-guard" && package != "replay-guard" {
                    return Err(format!("no package {package}"));
                }
            }
            "--path" => exists(&value()?)?,
            "--test" => {
                let name = value()?;
                let candidates = [
                    format!("tests/{name}.rs"),
                    format!("cli/tests/{name}.rs"),
                    format!("cli/tests/{name}/main.rs"),
                ];
                if !candidates.iter().any(|c| root().join(c).exists()) {
                    return Err(format!("no test binary {name}"));
                }
            }
            "--example" => exists(&format!("examples/{}.rs", value()?))?,
            "--bench" => exists(&format!("benches/{}.rs", value()?))?,
            _ => {}
        }
    }
    // `cargo run [..] -- ARGS` runs the command: its arguments must parse.
    if subcommand == Some("run") && !words.iter().any(|w| w == "--example") {
        let rest: Vec<String> = words
            .iter()
            .skip_while(|w| *w != "--")
            .skip(1)
            .cloned()
            .collect();
        let mut argv = vec!["replay-guard".to_owned()];
        argv.extend(rest);
        return parse(&argv);
    }
    Ok(())
}

#[test]
fn every_command_line_of_the_guide_is_one_that_runs() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        for block in blocks(&text, "sh") {
            for line in command_lines(&block) {
                checked += 1;
                if let Err(why) = check(&line) {
                    wrong.push(format!("{}: `{line}`: {why}", page.display()));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} command lines found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_json_and_toml_block_of_the_guide_parses() {
    let (mut checked, mut configurations) = (0, 0);
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        for block in blocks(&text, "json") {
            let value: serde_json::Value = serde_json::from_str(&block)
                .unwrap_or_else(|e| panic!("{}: a json block: {e}\n{block}", page.display()));
            // An MCP client configuration that runs the command: its arguments parse.
            for server in value["mcpServers"]
                .as_object()
                .into_iter()
                .flat_map(|s| s.values())
            {
                if server["command"] == "replay-guard" {
                    let mut argv = vec!["replay-guard".to_owned()];
                    argv.extend(
                        server["args"]
                            .as_array()
                            .expect("args")
                            .iter()
                            .map(|a| a.as_str().expect("a string argument").to_owned()),
                    );
                    parse(&argv).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
                }
            }
            checked += 1;
        }
        for block in blocks(&text, "toml") {
            block
                .parse::<toml::Table>()
                .unwrap_or_else(|e| panic!("{}: a toml block: {e}\n{block}", page.display()));
            // A proxy configuration: one the proxy takes.
            if block.contains("[[route]]") {
                let path = std::env::temp_dir().join(format!(
                    "replay-guard-guide-{}.toml",
                    mcp_replay_guard::ExecutionId::new()
                ));
                std::fs::write(&path, &block).unwrap();
                let taken = crate::proxy::validate_config(&path);
                let _ = std::fs::remove_file(&path);
                taken.unwrap_or_else(|e| panic!("{}: {e:#}\n{block}", page.display()));
                configurations += 1;
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} blocks found");
    assert!(
        configurations >= 1,
        "no proxy configuration found in the guide"
    );
}

#[test]
fn a_wrong_command_line_is_caught() {
    assert!(check("replay-guard proxy --no-such-flag").is_err());
    assert!(check("cargo test --test no_such_binary").is_err());
    assert!(check("cargo run --example no_such_example").is_err());
    assert!(check("cargo test --features no_such_feature").is_err());
    assert!(check("MRG_NO_SUCH_VARIABLE=1 cargo test").is_err());
    assert!(check("no/such/script.sh").is_err());
    assert!(check("cargo run --release -- demo").is_ok());
    assert_eq!(
        words(r#"a '{"x": 1}' "b c" d"#),
        ["a", r#"{"x": 1}"#, "b c", "d"]
    );
    let lines: Vec<String> = command_lines("a \\\n  b # c\nd && e\n")
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(lines, ["a b", "d", "e"]);
}
