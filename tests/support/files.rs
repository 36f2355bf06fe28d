//! Files a test writes or edits: CSV data, pipeline TOML, copied folders.

use std::fs;
use std::path::Path;

/// A CSV file with a header row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Csv {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    pub fn read(path: &Path) -> Csv {
        let text = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Csv::parse(&text)
    }

    pub fn parse(text: &str) -> Csv {
        let mut lines = text.lines().filter(|l| !l.is_empty()).map(parse_csv_line);
        let header = lines.next().unwrap_or_default();
        Csv {
            header,
            rows: lines.collect(),
        }
    }

    pub fn write(&self, path: &Path) {
        fs::write(path, self.to_text())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    pub fn to_text(&self) -> String {
        let mut out = csv_line(&self.header);
        for row in &self.rows {
            out.push_str(&csv_line(row));
        }
        out
    }

    /// Index of a header column.
    pub fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.header))
    }

    /// The row whose first column is `id`.
    pub fn row_mut(&mut self, id: &str) -> &mut Vec<String> {
        self.rows
            .iter_mut()
            .find(|r| r[0] == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    }

    /// Sets `column` of the row whose first column is `id`.
    pub fn set(&mut self, id: &str, column: &str, value: &str) {
        let c = self.col(column);
        self.row_mut(id)[c] = value.to_string();
    }

    /// Removes the row whose first column is `id`.
    pub fn remove(&mut self, id: &str) {
        let before = self.rows.len();
        self.rows.retain(|r| r[0] != id);
        assert_eq!(
            self.rows.len() + 1,
            before,
            "row {id} should have been removed once"
        );
    }
}

fn parse_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if field.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

fn csv_line(fields: &[String]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\n']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect();
    format!("{}\n", quoted.join(","))
}

/// Copies the folder `from` to `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create dir");
    for entry in fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Sets `key = value` in `[section]` of TOML text (line-based: the example
/// pipelines keep one key per line).
pub fn set_toml_key(text: &str, section: &str, key: &str, value: &str) -> String {
    let (header, array_header) = (format!("[{section}]"), format!("[[{section}]]"));
    let mut out = Vec::new();
    let mut in_section = false;
    let mut done = false;
    let lines: Vec<&str> = text.lines().collect();
    for line in &lines {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            if in_section && !done {
                // Key absent: insert before the next section.
                out.push(format!("{key} = {value}"));
                done = true;
            }
            in_section = trimmed == header || trimmed == array_header;
        }
        if in_section && !done {
            let name = trimmed.split('=').next().unwrap_or("").trim();
            if name == key && trimmed.contains('=') {
                out.push(format!("{key} = {value}"));
                done = true;
                continue;
            }
        }
        out.push((*line).to_string());
    }
    if !done {
        if !in_section {
            out.push(header);
        }
        out.push(format!("{key} = {value}"));
    }
    let mut joined = out.join("\n");
    joined.push('\n');
    joined
}
