//! The shared traces' CSV (`../shared/data/`): comma-separated, no quoting, a header row whose
//! leading columns are checked so a file of another format fails with a clear message instead
//! of being misread.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// The file's text, with its path in the error.
pub fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The data rows of `text` (blank lines skipped) whose header starts with `cols`; each row has
/// at least `cols.len()` fields.
pub fn rows<'a>(text: &'a str, cols: &[&str]) -> Result<impl Iterator<Item = Result<Vec<&'a str>>> + 'a> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').map(str::trim).collect();
    if header.len() < cols.len() || header[..cols.len()] != *cols {
        bail!("expected columns {cols:?}, found {header:?}");
    }
    let n = cols.len();
    Ok(lines.filter(|l| !l.trim().is_empty()).map(move |l| {
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() < n {
            bail!("{} fields, expected at least {n}", f.len());
        }
        Ok(f)
    }))
}

/// Every data row of `text` (read from `path`, named in errors with the row number).
pub fn all_rows<'a>(text: &'a str, path: &Path, cols: &[&str]) -> Result<Vec<Vec<&'a str>>> {
    rows(text, cols)
        .with_context(|| path.display().to_string())?
        .enumerate()
        .map(|(i, r)| r.with_context(|| format!("{} row {}", path.display(), i + 2)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_short_rows_are_errors_naming_the_place() {
        let p = Path::new("t.csv");
        let ok = all_rows("a,b,c\n1,2,3\n\n4,5\n", p, &["a", "b"]).unwrap();
        assert_eq!(ok, vec![vec!["1", "2", "3"], vec!["4", "5"]]);
        let e = all_rows("x,b\n1,2\n", p, &["a", "b"]).unwrap_err();
        assert!(format!("{e:#}").contains("t.csv") && format!("{e:#}").contains("expected columns"), "{e:#}");
        let e = all_rows("a,b\n1\n", p, &["a", "b"]).unwrap_err();
        assert!(format!("{e:#}").contains("t.csv row 2"), "{e:#}");
    }
}
