//! Drawing the annotation screen from the app state (ratatui). Laid out for 80×24 and degrading
//! on smaller terminals: long endings wrap; when six endings do not fit, the selected one is
//! shown whole and the others are cut with "…"; the key help shrinks to one line.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use afkit_store::dataset::{Judgement, Rank};

use super::app::{App, Item, Tone};
use super::text::{self, words};

/// The instructions shown by `?` (written for annotators; same meaning as SWAG Figure 3).
pub(crate) const INSTRUCTIONS: &str = include_str!("../../../prompts/annotation_instructions.md");

/// Key reference shown above the instructions.
const KEY_REFERENCE: &str = "## Keys\n\
- **1**–**6** or **↑**/**↓** (**j**/**k**): select an ending\n\
- **l** likely · **u** unlikely · **g** gibberish: label the selected ending (moves to the next)\n\
- **b** / **s**: mark the selected ending best / second best (again to unmark)\n\
- **Backspace**: clear the selected ending's label and mark\n\
- **Enter**: submit (only when every ending is labelled and best and second are picked)\n\
- **n**: skip this item · **x**: flag it as broken · **z**: undo your last submission, skip or flag\n\
- **?**: these instructions · **q**: quit (your work is saved; run the same command to resume)\n";

const MIN_WIDTH: u16 = 40;
const MIN_HEIGHT: u16 = 12;
/// Columns before an ending's text: "▶1 " + label (10) + mark (6).
const PREFIX: usize = 19;

pub(crate) fn draw(frame: &mut Frame, app: &mut App) {
    let area = frame.area();
    app.hidden = area.width < MIN_WIDTH || area.height < MIN_HEIGHT;
    if app.hidden {
        let text = format!(
            "Terminal too small ({}×{}); afkit annotate needs at least {MIN_WIDTH}×{MIN_HEIGHT} (80×24 is best). Keys are ignored until it is larger; q quits.",
            area.width, area.height
        );
        let lines = text::wrap(&words(&text, Style::default()), area.width as usize, 0, 0);
        frame.render_widget(Paragraph::new(lines), area);
        return;
    }
    let [top, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    draw_top_line(frame, top, app);
    if app.help.is_some() {
        draw_help(frame, body, app);
    } else {
        match &app.item {
            Some(item) => draw_item(frame, body, item, app),
            None => draw_nothing_left(frame, body, app),
        }
    }
}

fn draw_top_line(frame: &mut Frame, area: Rect, app: &App) {
    let p = &app.progress;
    let rate = p
        .per_hour
        .map_or_else(|| "–".to_string(), |r| format!("{r:.0}"));
    let right = format!("done {} · {rate}/h · {} left ", p.done, p.remaining);
    let left = format!(" afkit annotate · {}", app.annotator);
    let width = area.width as usize;
    let pad = width.saturating_sub(left.chars().count() + right.chars().count());
    let line = if pad == 0 {
        format!("{right:>width$}")
    } else {
        format!("{left}{}{right}", " ".repeat(pad))
    };
    frame.render_widget(
        Paragraph::new(line).style(Style::default().add_modifier(Modifier::REVERSED)),
        area,
    );
}

fn draw_item(frame: &mut Frame, area: Rect, item: &Item, app: &App) {
    let width = area.width as usize;
    let task = &item.task;
    let mut context_words = words(&task.sent1, Style::default());
    context_words.extend(words(
        &format!("{} …", task.sent2),
        Style::default().add_modifier(Modifier::BOLD),
    ));
    let context = text::truncate(text::wrap(&context_words, width - 1, 0, 0), 5, width - 1);
    let keys = key_lines(width, area.height);
    let [title, context_area, rule1, endings_area, rule2, status_area, keys_area] =
        Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(context.len() as u16),
            Constraint::Length(1),
            Constraint::Min(1),
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Length(keys.len() as u16),
        ])
        .areas(area);
    let kind = if task.round > 0 {
        format!(" · re-annotation round {}", task.round)
    } else if task.replicas > 1 {
        format!(" · agreement item ({} annotators)", task.replicas)
    } else {
        String::new()
    };
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(" Context", Style::default().add_modifier(Modifier::BOLD)),
            Span::styled(
                format!("  item {}{kind}", task.ext_id),
                Style::default().fg(Color::DarkGray),
            ),
        ])),
        title,
    );
    frame.render_widget(Paragraph::new(indent(context, 1)), context_area);
    let rule = Paragraph::new("─".repeat(width)).style(Style::default().fg(Color::DarkGray));
    frame.render_widget(rule.clone(), rule1);
    frame.render_widget(
        Paragraph::new(ending_lines(item, endings_area)),
        endings_area,
    );
    frame.render_widget(rule, rule2);
    frame.render_widget(Paragraph::new(status_line(item, app)), status_area);
    frame.render_widget(
        Paragraph::new(keys).style(Style::default().fg(Color::Gray)),
        keys_area,
    );
}

fn indent(lines: Vec<Line<'static>>, n: usize) -> Vec<Line<'static>> {
    lines
        .into_iter()
        .map(|mut l| {
            l.spans.insert(0, Span::raw(" ".repeat(n)));
            l
        })
        .collect()
}

/// The six endings, each "▶1 likely    BEST  text…", wrapped; fitted into `area`'s rows.
fn ending_lines(item: &Item, area: Rect) -> Vec<Line<'static>> {
    let width = area.width as usize;
    let rows = area.height as usize;
    let n = item.task.endings.len();
    let wrapped: Vec<Vec<Line<'static>>> = item
        .task
        .endings
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let selected = i == item.selected;
            let style = if selected {
                Style::default().add_modifier(Modifier::BOLD)
            } else {
                Style::default()
            };
            let mut lines = text::wrap(
                &words(&e.text, style),
                width.max(PREFIX + 10) - 1,
                PREFIX,
                PREFIX,
            );
            let mut prefix = ending_prefix(item, i);
            prefix.extend(std::mem::take(&mut lines[0].spans));
            lines[0].spans = prefix;
            if selected {
                for l in &mut lines {
                    l.style = Style::default().bg(Color::Rgb(40, 40, 60));
                }
            }
            lines
        })
        .collect();
    let heights = fit_heights(
        &wrapped.iter().map(Vec::len).collect::<Vec<_>>(),
        item.selected,
        rows,
    );
    let spacing = wrapped.iter().map(Vec::len).sum::<usize>() + n - 1 <= rows;
    let mut out = Vec::new();
    for (i, (lines, h)) in wrapped.into_iter().zip(heights).enumerate() {
        if h == 0 {
            continue;
        }
        out.extend(text::truncate(lines, h, width));
        if spacing && i + 1 < n {
            out.push(Line::default());
        }
    }
    out
}

/// Rows per ending when `rows` cannot hold them all: the selected ending whole if possible, every
/// other at least one row (more in order while rows are left); when not even one row each fits,
/// a window of endings around the selected one.
fn fit_heights(needed: &[usize], selected: usize, rows: usize) -> Vec<usize> {
    let n = needed.len();
    if needed.iter().sum::<usize>() <= rows {
        return needed.to_vec();
    }
    if rows < n {
        let start = selected.saturating_sub(rows / 2).min(n - rows.min(n));
        return (0..n)
            .map(|i| usize::from(i >= start && i < start + rows))
            .collect();
    }
    let mut heights = vec![1; n];
    let mut left = rows - n;
    let extra = (needed[selected] - 1).min(left);
    heights[selected] += extra;
    left -= extra;
    for i in 0..n {
        let extra = (needed[i] - heights[i]).min(left);
        heights[i] += extra;
        left -= extra;
    }
    heights
}

fn ending_prefix(item: &Item, i: usize) -> Vec<Span<'static>> {
    let selected = i == item.selected;
    let marker = if selected { "▶" } else { " " };
    let number = Span::styled(
        format!("{marker}{} ", i + 1),
        if selected {
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        },
    );
    let label = match item.judgements[i] {
        Some(j) => Span::styled(format!("{:<10}", j.as_str()), judgement_style(j)),
        None => Span::styled(format!("{:<10}", "·"), Style::default().fg(Color::DarkGray)),
    };
    let mark = match item.rank_of(i) {
        Some(Rank::Best) => Span::styled(
            "BEST  ",
            Style::default()
                .fg(Color::Magenta)
                .add_modifier(Modifier::BOLD),
        ),
        Some(Rank::Second) => Span::styled(
            "2ND   ",
            Style::default()
                .fg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
        ),
        None => Span::raw("      "),
    };
    vec![number, label, mark]
}

fn judgement_style(j: Judgement) -> Style {
    match j {
        Judgement::Likely => Style::default().fg(Color::Green),
        Judgement::Unlikely => Style::default().fg(Color::Yellow),
        Judgement::Gibberish => Style::default().fg(Color::Red),
    }
}

/// The last action's message, else what is still missing, else "complete".
fn status_line(item: &Item, app: &App) -> Line<'static> {
    let (tone, text) = match &app.message {
        Some(m) => (m.tone, m.text.clone()),
        None => {
            let problems = item.problems();
            if problems.is_empty() {
                (Tone::Good, "complete: Enter to submit".to_string())
            } else {
                (
                    Tone::Info,
                    format!("to do: {}", super::verdict::describe(&problems)),
                )
            }
        }
    };
    let style = match tone {
        Tone::Info => Style::default(),
        Tone::Good => Style::default()
            .fg(Color::Green)
            .add_modifier(Modifier::BOLD),
        Tone::Warn => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
    };
    Line::from(Span::styled(format!(" {text}"), style))
}

/// The key help: two lines at 80 columns, one short line when space is tight.
fn key_lines(width: usize, height: u16) -> Vec<Line<'static>> {
    let full = [
        " ↑↓/1-6 select · l likely · u unlikely · g gibberish · b best · s second",
        " Enter submit · ? instructions · z undo · n skip · x flag broken · q quit",
    ];
    if width >= 76 && height >= 20 {
        full.iter().map(|l| Line::from(*l)).collect()
    } else {
        vec![Line::from(
            " l/u/g label · b/s best/2nd · Enter · ? help · q",
        )]
    }
}

fn draw_nothing_left(frame: &mut Frame, area: Rect, app: &App) {
    let text = format!(
        "Nothing left for you, {}: every item is done, skipped, or has all its annotators. \
         You submitted {} items. z undoes your last one; q quits.",
        app.annotator, app.progress.done
    );
    let mut lines = vec![Line::default()];
    lines.extend(indent(
        text::wrap(
            &words(&text, Style::default()),
            area.width as usize - 2,
            0,
            0,
        ),
        1,
    ));
    if let Some(m) = &app.message {
        lines.push(Line::default());
        lines.push(Line::from(format!(" {}", m.text)));
    }
    frame.render_widget(Paragraph::new(lines), area);
}

fn draw_help(frame: &mut Frame, area: Rect, app: &mut App) {
    let [title, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(
        Paragraph::new(" Instructions · ↑↓ PgUp PgDn scroll · ? or Esc back")
            .style(Style::default().add_modifier(Modifier::BOLD)),
        title,
    );
    let width = area.width as usize - 2;
    let mut lines = text::markdown(KEY_REFERENCE, width);
    lines.push(Line::default());
    lines.extend(text::markdown(INSTRUCTIONS, width));
    let help = app.help.as_mut().expect("help is open");
    help.max_scroll = lines.len().saturating_sub(body.height as usize) as u16;
    help.scroll = help.scroll.min(help.max_scroll);
    frame.render_widget(
        Paragraph::new(indent(lines, 1)).scroll((help.scroll, 0)),
        body,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{Item, Key};
    use afkit_store::annotate::tasks::{TaskEnding, TaskView};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn app_with(endings: &[&str]) -> App {
        let task = TaskView {
            task_id: 1,
            example_id: 1,
            ext_id: "v_abc#3".into(),
            round: 0,
            replicas: 3,
            submitted: 0,
            open: true,
            sent1: "Someone is shown sitting on a fence and talking to the camera while pointing out horses.".into(),
            sent2: "Someone".into(),
            endings: endings
                .iter()
                .enumerate()
                .map(|(i, t)| TaskEnding {
                    ending_id: i as i64,
                    text: t.to_string(),
                    is_gold: i == 0,
                })
                .collect(),
        };
        let mut app = App::new("alice");
        app.show(Some(Item::new(task)));
        app
    }

    fn screen(app: &mut App, w: u16, h: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| draw(f, app)).unwrap();
        let buf = terminal.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect()
    }

    const LONG: &str =
        "rides a horse using a hose while the crowd behind the fence cheers loudly, \
        a dog runs in circles around the small arena, and the old man in the red hat keeps \
        waving a flag around them all.";

    #[test]
    fn six_long_endings_fit_80_by_24() {
        let mut app = app_with(&[LONG; 6]);
        for c in "lug".chars() {
            app.on_key(Key::Char(c));
        }
        app.on_key(Key::Char('1'));
        app.on_key(Key::Char('b'));
        let rows = screen(&mut app, 80, 24);
        let text = rows.join("\n");
        for n in 1..=6 {
            assert!(
                rows.iter()
                    .any(|r| r.starts_with(&format!(" {n} ")) || r.starts_with(&format!("▶{n} "))),
                "ending {n} missing:\n{text}"
            );
        }
        assert!(text.contains("BEST"), "{text}");
        assert!(text.contains("likely") && text.contains("unlikely") && text.contains("gibberish"));
        assert!(text.contains("Enter submit"), "keys are shown:\n{text}");
        assert!(text.contains("to do: label endings 4, 5, 6"), "{text}");
        assert!(text.contains("Someone is shown sitting"), "{text}");
        assert!(text.contains("done 0"), "{text}");
        // The selected ending (1) is shown whole, the others cut.
        assert!(text.contains("them all."), "{text}");
        assert!(text.contains("…"), "{text}");
    }

    #[test]
    fn short_endings_are_spaced_and_a_small_terminal_degrades() {
        let mut app = app_with(&["a.", "b.", "c.", "d.", "e.", "f."]);
        let rows = screen(&mut app, 80, 24);
        assert!(rows.iter().any(|r| r.trim().is_empty()));
        let rows = screen(&mut app, 50, 14);
        let text = rows.join("\n");
        assert!(text.contains("l/u/g label"), "{text}");
        let rows = screen(&mut app, 30, 8);
        assert!(rows.join("").contains("too small"));
    }

    #[test]
    fn help_scrolls_within_the_text() {
        let mut app = app_with(&["a.", "b."]);
        app.on_key(Key::Char('?'));
        let first = screen(&mut app, 80, 24).join("\n");
        assert!(first.contains("Instructions"));
        assert!(first.contains("Keys"));
        for _ in 0..200 {
            app.on_key(Key::PageDown);
            screen(&mut app, 80, 24);
        }
        let help = app.help.unwrap();
        assert_eq!(help.scroll, help.max_scroll);
        assert!(
            help.max_scroll > 0,
            "the instructions are longer than a screen"
        );
    }

    #[test]
    fn fitting_prefers_the_selected_ending() {
        assert_eq!(fit_heights(&[3, 3, 3], 1, 9), [3, 3, 3]);
        assert_eq!(fit_heights(&[3, 3, 3], 1, 6), [2, 3, 1]);
        assert_eq!(fit_heights(&[3, 3, 3, 3], 3, 2), [0, 0, 1, 1]);
    }
}
