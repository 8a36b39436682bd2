//! A small line diff for `weftctl apply --dry-run`: a longest-common-subsequence alignment of
//! two texts, printed as unified-style hunks. Pure; the specs it compares are a few hundred
//! lines at most, so the quadratic table is cheap (and capped for pathological input).

use std::fmt::Write as _;

/// One line of an alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    Same(&'a str),
    Del(&'a str),
    Add(&'a str),
}

/// Above this many table cells the middle part is shown as all-removed then all-added rather
/// than aligned (still a correct diff, just not a minimal one).
const MAX_CELLS: usize = 4_000_000;

/// Aligns `a` with `b`: every line of `a` appears once as `Same` or `Del`, in order, and every
/// line of `b` once as `Same` or `Add`, with as many `Same` lines as possible.
pub fn diff_lines<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Line<'a>> {
    // Common prefix and suffix first: specs usually differ in a few lines.
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..].iter().rev().zip(b[prefix..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (am, bm) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);

    let mut out: Vec<Line<'a>> = a[..prefix].iter().map(|l| Line::Same(l)).collect();
    let (n, m) = (am.len(), bm.len());
    if n.saturating_mul(m) > MAX_CELLS {
        out.extend(am.iter().map(|l| Line::Del(l)));
        out.extend(bm.iter().map(|l| Line::Add(l)));
    } else {
        // lcs[i][j] = length of the LCS of am[i..] and bm[j..].
        let w = m + 1;
        let mut lcs = vec![0u32; (n + 1) * w];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i * w + j] = if am[i] == bm[j] {
                    lcs[(i + 1) * w + j + 1] + 1
                } else {
                    lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if am[i] == bm[j] {
                out.push(Line::Same(am[i]));
                i += 1;
                j += 1;
            } else if lcs[(i + 1) * w + j] >= lcs[i * w + j + 1] {
                out.push(Line::Del(am[i]));
                i += 1;
            } else {
                out.push(Line::Add(bm[j]));
                j += 1;
            }
        }
        out.extend(am[i..].iter().map(|l| Line::Del(l)));
        out.extend(bm[j..].iter().map(|l| Line::Add(l)));
    }
    out.extend(a[a.len() - suffix..].iter().map(|l| Line::Same(l)));
    out
}

/// `a` and `b` as a unified diff (`--- from`, `+++ to`, `@@ -l,n +l,n @@` hunks with
/// `context` lines around each change); empty when they are equal.
pub fn unified(a: &str, b: &str, from: &str, to: &str, context: usize) -> String {
    let al: Vec<&str> = a.lines().collect();
    let bl: Vec<&str> = b.lines().collect();
    let lines = diff_lines(&al, &bl);
    let changed: Vec<usize> =
        lines.iter().enumerate().filter(|(_, l)| !matches!(l, Line::Same(_))).map(|(i, _)| i).collect();
    if changed.is_empty() {
        return String::new();
    }
    // Hunks: ranges of `lines` covering changes plus context, merged when they touch.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &c in &changed {
        let (s, e) = (c.saturating_sub(context), (c + context + 1).min(lines.len()));
        match hunks.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => hunks.push((s, e)),
        }
    }
    // Line numbers in a and b at every position of `lines`.
    let mut pos = Vec::with_capacity(lines.len() + 1);
    let (mut ia, mut ib) = (0usize, 0usize);
    for l in &lines {
        pos.push((ia, ib));
        match l {
            Line::Same(_) => {
                ia += 1;
                ib += 1;
            }
            Line::Del(_) => ia += 1,
            Line::Add(_) => ib += 1,
        }
    }
    pos.push((ia, ib));

    let mut out = format!("--- {from}\n+++ {to}\n");
    for (s, e) in hunks {
        let slice = &lines[s..e];
        let na = slice.iter().filter(|l| !matches!(l, Line::Add(_))).count();
        let nb = slice.iter().filter(|l| !matches!(l, Line::Del(_))).count();
        // Unified convention: 1-based start, or the line before when the range is empty.
        let start = |p: usize, n: usize| if n == 0 { p } else { p + 1 };
        let _ = writeln!(out, "@@ -{},{na} +{},{nb} @@", start(pos[s].0, na), start(pos[s].1, nb));
        for l in slice {
            let _ = match l {
                Line::Same(t) => writeln!(out, " {t}"),
                Line::Del(t) => writeln!(out, "-{t}"),
                Line::Add(t) => writeln!(out, "+{t}"),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rebuild<'a>(lines: &[Line<'a>]) -> (Vec<&'a str>, Vec<&'a str>) {
        let a = lines
            .iter()
            .filter_map(|l| match l {
                Line::Same(t) | Line::Del(t) => Some(*t),
                _ => None,
            })
            .collect();
        let b = lines
            .iter()
            .filter_map(|l| match l {
                Line::Same(t) | Line::Add(t) => Some(*t),
                _ => None,
            })
            .collect();
        (a, b)
    }

    #[test]
    fn alignment_reproduces_both_sides_and_keeps_the_common_lines() {
        let cases: [(&[&str], &[&str], usize); 6] = [
            (&[], &[], 0),
            (&["a", "b", "c"], &["a", "b", "c"], 3),
            (&[], &["x", "y"], 0),
            (&["x", "y"], &[], 0),
            (&["a", "b", "c", "d"], &["a", "x", "c", "d", "e"], 3),
            (&["k", "a", "b", "k", "c"], &["a", "k", "b", "c", "k"], 3),
        ];
        for (a, b, same) in cases {
            let d = diff_lines(a, b);
            assert_eq!(rebuild(&d), (a.to_vec(), b.to_vec()), "{a:?} {b:?}");
            assert_eq!(d.iter().filter(|l| matches!(l, Line::Same(_))).count(), same, "{a:?} {b:?}: {d:?}");
        }
    }

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y", 3), "");
    }

    #[test]
    fn unified_hunks_with_context_and_line_numbers() {
        let a = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
        let b = "1\n2\nthree\n4\n5\n6\n7\n8\n9\n10\n11\n";
        let d = unified(a, b, "old", "new", 1);
        assert_eq!(d, "--- old\n+++ new\n@@ -2,3 +2,3 @@\n 2\n-3\n+three\n 4\n@@ -10,1 +10,2 @@\n 10\n+11\n");
        // Nearby changes share a hunk.
        let d = unified("a\nb\nc\nd\n", "A\nb\nC\nd\n", "o", "n", 1);
        assert_eq!(d, "--- o\n+++ n\n@@ -1,4 +1,4 @@\n-a\n+A\n b\n-c\n+C\n d\n");
    }

    #[test]
    fn creation_diffs_against_nothing() {
        assert_eq!(unified("", "a\nb\n", "absent", "new", 3), "--- absent\n+++ new\n@@ -0,0 +1,2 @@\n+a\n+b\n");
    }

    #[test]
    fn huge_inputs_fall_back_to_replace() {
        let a: Vec<String> = (0..3000).map(|i| format!("a{i}")).collect();
        let b: Vec<String> = (0..3000).map(|i| format!("b{i}")).collect();
        let (ar, br): (Vec<&str>, Vec<&str>) =
            (a.iter().map(String::as_str).collect(), b.iter().map(String::as_str).collect());
        let d = diff_lines(&ar, &br);
        assert_eq!(rebuild(&d), (ar.clone(), br.clone()));
    }
}
