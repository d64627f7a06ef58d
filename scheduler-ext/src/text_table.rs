//! Plain-text tables as kubectl prints them: a header row in capitals, columns padded to their
//! widest cell with two spaces between, the last column unpadded (no trailing blanks).

/// The rows (header first) laid out, one line each.
pub fn render(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut width = vec![0usize; columns];
    for row in rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i + 1 < row.len() {
                let w = width.get(i).copied().unwrap_or(0);
                line.push_str(&format!("{c:<w$}"));
            } else {
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_all_but_the_last_column() {
        let rows = vec![
            vec!["NODE".to_string(), "FREE".into(), "NOTE".into()],
            vec!["dgx-a".to_string(), "4".into(), "".into()],
            vec!["b".to_string(), "12".into(), "long note".into()],
        ];
        assert_eq!(
            render(&rows),
            "NODE   FREE  NOTE\ndgx-a  4\nb      12    long note\n"
        );
    }

    #[test]
    fn no_rows_no_text() {
        assert_eq!(render(&[]), "");
    }
}
