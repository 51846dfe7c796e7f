//! Word wrapping of styled text to a terminal width, and the small part of Markdown the
//! instructions use (headings, bullets, tables, `**bold**`, `*italic*`, `` `examples` ``).
//!
//! The UI wraps text itself, rather than letting the paragraph widget do it, because it must
//! know how many rows each ending takes to fit six of them into 24 lines.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthStr;

/// A word and its style; words are separated by single spaces when laid out, except a glued
/// word, which continues the previous one (a change of style inside a word).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Word {
    pub text: String,
    pub style: Style,
    pub glue: bool,
}

/// Splits plain text into words of one style.
pub(crate) fn words(text: &str, style: Style) -> Vec<Word> {
    text.split_whitespace()
        .map(|w| Word {
            text: w.to_string(),
            style,
            glue: false,
        })
        .collect()
}

/// Greedy word wrap into lines at most `width` columns wide; the first line starts after
/// `first_indent` columns of the caller's prefix, the others after `rest_indent` spaces (which
/// this function adds). Words longer than a line are broken.
pub(crate) fn wrap(
    words: &[Word],
    width: usize,
    first_indent: usize,
    rest_indent: usize,
) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    let mut spans: Vec<Span<'static>> = Vec::new();
    let mut used = first_indent;
    let mut indent = first_indent;
    let flush = |spans: &mut Vec<Span<'static>>, lines: &mut Vec<Line<'static>>| {
        lines.push(Line::from(std::mem::take(spans)));
    };
    for Word { text, style, glue } in words {
        let mut word = text.as_str();
        loop {
            let w = word.width();
            let gap = usize::from(used > indent && !glue);
            if used + gap + w <= width {
                if gap == 1 {
                    spans.push(Span::raw(" "));
                }
                spans.push(Span::styled(word.to_string(), *style));
                used += gap + w;
                break;
            }
            if used > indent {
                flush(&mut spans, &mut lines);
                spans.push(Span::raw(" ".repeat(rest_indent)));
                used = rest_indent;
                indent = rest_indent;
                continue;
            }
            // A word wider than a whole line: break it at the line's end.
            let room = width.saturating_sub(used).max(1);
            let (head, tail) = split_at_width(word, room);
            spans.push(Span::styled(head.to_string(), *style));
            flush(&mut spans, &mut lines);
            spans.push(Span::raw(" ".repeat(rest_indent)));
            used = rest_indent;
            indent = rest_indent;
            word = tail;
            if word.is_empty() {
                break;
            }
        }
    }
    if !spans.is_empty() || lines.is_empty() {
        flush(&mut spans, &mut lines);
    }
    lines
}

fn split_at_width(word: &str, width: usize) -> (&str, &str) {
    let mut used = 0;
    for (i, c) in word.char_indices() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > width && i > 0 {
            return word.split_at(i);
        }
        used += w;
    }
    (word, "")
}

/// Cuts `lines` to `max` lines, ending the last kept one with "…" when something was cut.
pub(crate) fn truncate(
    mut lines: Vec<Line<'static>>,
    max: usize,
    width: usize,
) -> Vec<Line<'static>> {
    if lines.len() <= max {
        return lines;
    }
    lines.truncate(max);
    if let Some(last) = lines.last_mut() {
        let mut w: usize = last.spans.iter().map(|s| s.content.width()).sum();
        while w + 2 > width {
            let Some(span) = last.spans.pop() else { break };
            w -= span.content.width();
        }
        last.spans.push(Span::raw(" …"));
    }
    lines
}

/// One paragraph of the instructions with its indentation.
struct Block {
    words: Vec<Word>,
    first_indent: usize,
    rest_indent: usize,
    prefix: Option<Span<'static>>,
}

/// Renders the Markdown of the instructions into lines of at most `width` columns.
pub(crate) fn markdown(source: &str, width: usize) -> Vec<Line<'static>> {
    let mut out: Vec<Line<'static>> = Vec::new();
    for block in blocks(source) {
        let Some(block) = block else {
            out.push(Line::default());
            continue;
        };
        let mut lines = wrap(&block.words, width, block.first_indent, block.rest_indent);
        if let Some(prefix) = block.prefix {
            lines[0].spans.insert(0, prefix);
        }
        out.extend(lines);
    }
    out
}

fn blocks(source: &str) -> Vec<Option<Block>> {
    let heading = Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    let mut out: Vec<Option<Block>> = Vec::new();
    let widths = table_widths(source);
    for (n, raw) in source.lines().enumerate() {
        let line = raw.trim_end();
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            out.push(None);
        } else if let Some(h) = trimmed.strip_prefix('#') {
            let text = h.trim_start_matches('#').trim();
            out.push(Some(Block {
                words: words(text, heading),
                first_indent: 0,
                rest_indent: 0,
                prefix: None,
            }));
        } else if let Some(item) = trimmed
            .strip_prefix("- ")
            .or_else(|| trimmed.strip_prefix("* "))
        {
            let depth = line.len() - trimmed.len();
            out.push(Some(Block {
                words: inline(item),
                first_indent: depth + 2,
                rest_indent: depth + 2,
                prefix: Some(Span::raw(format!("{}• ", " ".repeat(depth)))),
            }));
        } else if trimmed.starts_with('|') {
            let cells = table_cells(trimmed);
            if is_table_rule(&cells) {
                continue;
            }
            out.push(Some(table_row(&cells, &widths[n])));
        } else {
            out.push(Some(Block {
                words: inline(trimmed),
                first_indent: 0,
                rest_indent: 0,
                prefix: None,
            }));
        }
    }
    out
}

/// The cells of a Markdown table row, emphasis resolved.
fn table_cells(row: &str) -> Vec<Vec<Word>> {
    row.trim_matches('|')
        .split('|')
        .map(|c| inline(c.trim()))
        .collect()
}

/// The `| --- | :-: |` line under a table's header.
fn is_table_rule(cells: &[Vec<Word>]) -> bool {
    cells.iter().all(|c| {
        c.iter()
            .all(|w| w.text.chars().all(|ch| matches!(ch, '-' | ':')))
    })
}

/// Columns a cell's words take when laid out on one line.
fn cell_width(words: &[Word]) -> usize {
    words
        .iter()
        .enumerate()
        .map(|(i, w)| w.text.width() + usize::from(i > 0 && !w.glue))
        .sum()
}

/// For every line of `source` that belongs to a table, the width of each of that table's
/// columns (its widest cell), so that the rows line up.
fn table_widths(source: &str) -> Vec<Vec<usize>> {
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    let mut widths = vec![Vec::new(); lines.len()];
    let mut start = 0;
    while start < lines.len() {
        if !lines[start].starts_with('|') {
            start += 1;
            continue;
        }
        let end = (start..lines.len())
            .find(|&i| !lines[i].starts_with('|'))
            .unwrap_or(lines.len());
        let mut table: Vec<usize> = Vec::new();
        for line in &lines[start..end] {
            let cells = table_cells(line);
            if is_table_rule(&cells) {
                continue;
            }
            for (i, cell) in cells.iter().enumerate() {
                let w = cell_width(cell);
                match table.get_mut(i) {
                    Some(max) => *max = (*max).max(w),
                    None => table.push(w),
                }
            }
        }
        widths[start..end].fill(table);
        start = end;
    }
    widths
}

/// A table row with every cell but the last padded to its column's width; the last cell wraps
/// under its own column.
fn table_row(cells: &[Vec<Word>], widths: &[usize]) -> Block {
    let mut words = Vec::new();
    let mut last_column = 2;
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            words.push(Word {
                text: "│".to_string(),
                style: Style::default().fg(Color::DarkGray),
                glue: false,
            });
        }
        words.extend(cell.iter().cloned());
        if i + 1 < cells.len() {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell_width(cell));
            if pad > 0 {
                words.push(Word {
                    text: " ".repeat(pad),
                    style: Style::default(),
                    glue: true,
                });
            }
            last_column += width + 3;
        }
    }
    Block {
        words,
        first_indent: 2,
        rest_indent: last_column,
        prefix: Some(Span::raw("  ")),
    }
}

/// Inline emphasis: `**bold**`, `*italic*`, `` `code` `` (shown as an example, in colour).
/// A style change inside a word ("**likely**:") glues the pieces back together.
fn inline(text: &str) -> Vec<Word> {
    let mut out: Vec<Word> = Vec::new();
    let (mut bold, mut italic, mut code) = (false, false, false);
    let mut current = String::new();
    let mut glue_next = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let style = emphasis(bold, italic, code);
        let toggles = match c {
            '`' => {
                code = !code;
                true
            }
            '*' if !code && chars.peek() == Some(&'*') => {
                chars.next();
                bold = !bold;
                true
            }
            '*' if !code => {
                italic = !italic;
                true
            }
            _ => false,
        };
        if toggles || c.is_whitespace() {
            if !current.is_empty() {
                out.push(Word {
                    text: std::mem::take(&mut current),
                    style,
                    glue: glue_next,
                });
                glue_next = toggles;
            }
            if c.is_whitespace() {
                glue_next = false;
            }
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        out.push(Word {
            text: current,
            style: emphasis(bold, italic, code),
            glue: glue_next,
        });
    }
    out
}

fn emphasis(bold: bool, italic: bool, code: bool) -> Style {
    let mut s = Style::default();
    if bold {
        s = s.add_modifier(Modifier::BOLD);
    }
    if italic {
        s = s.add_modifier(Modifier::ITALIC);
    }
    if code {
        s = s.fg(Color::Cyan);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Line]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    #[test]
    fn wraps_at_word_boundaries_with_hanging_indent() {
        let w = words(
            "the quick brown fox jumps over the lazy dog",
            Style::default(),
        );
        let lines = wrap(&w, 16, 4, 4);
        assert_eq!(
            plain(&lines),
            [
                "the quick",
                "    brown fox",
                "    jumps over",
                "    the lazy dog"
            ]
        );
        for l in &lines[1..] {
            assert!(l.width() <= 16);
        }
    }

    #[test]
    fn breaks_words_longer_than_a_line() {
        let w = words("abcdefghijklmnop", Style::default());
        let lines = wrap(&w, 6, 0, 0);
        assert_eq!(plain(&lines), ["abcdef", "ghijkl", "mnop"]);
    }

    #[test]
    fn truncation_marks_the_cut() {
        let w = words("one two three four five six", Style::default());
        let lines = truncate(wrap(&w, 9, 0, 0), 2, 9);
        assert_eq!(plain(&lines), ["one two", "three …"]);
    }

    #[test]
    fn table_columns_line_up_and_the_last_wraps_under_itself() {
        let md = "| ending | label | why |\n| --- | --- | --- |\n\
                  | pours paint into a tray. | likely | the natural next step |\n\
                  | drinks it. | unlikely | clear but absurd and more |\n";
        let lines = plain(&markdown(md, 60));
        let bars: Vec<Vec<usize>> = lines
            .iter()
            .filter(|l| l.contains('│'))
            .map(|l| {
                l.char_indices()
                    .filter(|(_, c)| *c == '│')
                    .map(|(i, _)| l[..i].chars().count())
                    .collect()
            })
            .collect();
        assert_eq!(bars.len(), 3, "{lines:?}");
        assert!(bars.iter().all(|b| b == &bars[0]), "{lines:?}");
        let wrapped = lines
            .iter()
            .find(|l| !l.contains('│') && !l.trim().is_empty())
            .unwrap();
        let why = lines[1][..lines[1].find("the natural").unwrap()]
            .chars()
            .count();
        assert_eq!(wrapped.len() - wrapped.trim_start().len(), why, "{lines:?}");
    }

    #[test]
    fn markdown_headings_bullets_tables_and_emphasis() {
        let md = "# Title\n\n- **likely**: fits (*here*)\n| a | b |\n| --- | --- |\n| x | y |\n";
        let lines = markdown(md, 40);
        assert_eq!(
            plain(&lines),
            ["Title", "", "• likely: fits (here)", "  a │ b", "  x │ y"]
        );
        let bold = &lines[2].spans[1];
        assert_eq!(bold.content, "likely");
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
    }
}
