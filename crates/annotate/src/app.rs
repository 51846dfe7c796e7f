//! The annotation UI's state and its key → state transitions, free of terminal and database:
//! [`App::on_key`] changes the state and returns the [`Action`] the session must carry out
//! (store a submission, skip, undo, quit); the session then loads the next item.

use afkit_store::annotate::labels::EndingLabel;
use afkit_store::annotate::tasks::TaskView;
use afkit_store::dataset::{Judgement, Rank};

use super::verdict::{self, Problem};

/// A key press, as the app understands it (terminal and script input both map to this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Enter,
    Esc,
    Backspace,
    CtrlC,
    Char(char),
}

/// What the session must do after a key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    None,
    Submit {
        task_id: i64,
        labels: Vec<EndingLabel>,
    },
    Skip(i64),
    Flag(i64),
    Undo,
    Quit,
}

/// The item on screen and the annotator's choices so far.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    pub task: TaskView,
    pub judgements: Vec<Option<Judgement>>,
    pub best: Option<usize>,
    pub second: Option<usize>,
    pub selected: usize,
}

impl Item {
    pub(crate) fn new(task: TaskView) -> Item {
        let n = task.endings.len();
        Item {
            task,
            judgements: vec![None; n],
            best: None,
            second: None,
            selected: 0,
        }
    }

    /// An item brought back by undo, with its earlier labels filled in.
    pub(crate) fn with_labels(task: TaskView, labels: &[EndingLabel]) -> Item {
        let mut item = Item::new(task);
        for (i, ending) in item.task.endings.iter().enumerate() {
            if let Some(l) = labels.iter().find(|l| l.ending_id == ending.ending_id) {
                item.judgements[i] = Some(l.judgement);
                match l.rank {
                    Some(Rank::Best) => item.best = Some(i),
                    Some(Rank::Second) => item.second = Some(i),
                    None => {}
                }
            }
        }
        item
    }

    pub(crate) fn problems(&self) -> Vec<Problem> {
        verdict::problems(&self.judgements, self.best, self.second)
    }

    pub(crate) fn rank_of(&self, i: usize) -> Option<Rank> {
        if self.best == Some(i) {
            Some(Rank::Best)
        } else if self.second == Some(i) {
            Some(Rank::Second)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Info,
    Good,
    Warn,
}

/// A one-line message for the status line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub tone: Tone,
    pub text: String,
}

/// The annotator's standing, shown on the top line.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Standing {
    pub done: i64,
    pub per_hour: Option<f64>,
    pub remaining: i64,
}

/// The instructions overlay: its scroll offset, clamped by the drawing code to the text height.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Help {
    pub scroll: u16,
    pub max_scroll: u16,
}

impl Help {
    /// Scrolls the help text; returns whether the key closes it.
    fn on_key(&mut self, key: Key) -> bool {
        match key {
            Key::Up | Key::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            Key::Down | Key::Char('j') => self.scroll = (self.scroll + 1).min(self.max_scroll),
            Key::PageUp => self.scroll = self.scroll.saturating_sub(10),
            Key::PageDown | Key::Char(' ') => self.scroll = (self.scroll + 10).min(self.max_scroll),
            Key::Home => self.scroll = 0,
            Key::End => self.scroll = self.max_scroll,
            Key::Esc | Key::Char('?') | Key::Char('q') | Key::Enter => return true,
            _ => {}
        }
        false
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct App {
    pub annotator: String,
    /// `None` when nothing is left for this annotator.
    pub item: Option<Item>,
    pub help: Option<Help>,
    pub message: Option<Message>,
    pub progress: Standing,
    /// The terminal is too small to show the item (the drawing code says so): every key but
    /// quitting is ignored, so nothing is labelled unseen.
    pub hidden: bool,
}

impl App {
    pub(crate) fn new(annotator: &str) -> App {
        App {
            annotator: annotator.to_string(),
            item: None,
            help: None,
            message: None,
            progress: Standing::default(),
            hidden: false,
        }
    }

    /// Shows the next item (or the "nothing left" screen).
    pub(crate) fn show(&mut self, item: Option<Item>) {
        self.item = item;
    }

    pub(crate) fn say(&mut self, tone: Tone, text: impl Into<String>) {
        self.message = Some(Message {
            tone,
            text: text.into(),
        });
    }

    /// Pasted text is never taken as keys: a paste of ordinary words would undo (`z`), quit (`q`)
    /// or label endings.
    pub(crate) fn on_paste(&mut self) {
        self.say(
            Tone::Warn,
            "pasted text ignored: annotate takes one key at a time",
        );
    }

    pub(crate) fn on_key(&mut self, key: Key) -> Action {
        match self.on_session_key(key) {
            Some(action) => action,
            None => self.on_item_key(key),
        }
    }

    /// Keys that work whatever is on screen: quitting, the hidden screen, help and undo. `None`
    /// when the key is for the item.
    fn on_session_key(&mut self, key: Key) -> Option<Action> {
        if key == Key::CtrlC {
            return Some(Action::Quit);
        }
        if self.hidden {
            return Some(if key == Key::Char('q') {
                Action::Quit
            } else {
                Action::None
            });
        }
        if let Some(help) = &mut self.help {
            if help.on_key(key) {
                self.help = None;
            }
            return Some(Action::None);
        }
        match key {
            Key::Char('?') => {
                self.help = Some(Help::default());
                Some(Action::None)
            }
            Key::Char('q') => Some(Action::Quit),
            Key::Char('z') => Some(Action::Undo),
            _ => None,
        }
    }

    /// Keys on the item on screen: move, label, rank, clear, submit, skip, flag as broken.
    fn on_item_key(&mut self, key: Key) -> Action {
        let Some(item) = &mut self.item else {
            self.say(
                Tone::Info,
                "nothing left for you: q to quit, z to undo your last item",
            );
            return Action::None;
        };
        self.message = None;
        let n = item.judgements.len();
        match key {
            Key::Up | Key::Char('k') => item.selected = item.selected.saturating_sub(1),
            Key::Down | Key::Char('j') | Key::Char('\t') => {
                item.selected = (item.selected + 1).min(n - 1)
            }
            Key::Home => item.selected = 0,
            Key::End => item.selected = n - 1,
            Key::Char(c @ '1'..='9') => {
                let i = c as usize - '1' as usize;
                if i < n {
                    item.selected = i;
                } else {
                    self.say(Tone::Warn, format!("there are only {n} endings"));
                }
            }
            Key::Char(c @ ('l' | 'u' | 'g')) => {
                self.judge(Judgement::parse(&c.to_string()).expect("l, u, g are judgements"))
            }
            Key::Char('b') => self.rank(Rank::Best),
            Key::Char('s') => self.rank(Rank::Second),
            Key::Backspace | Key::Char('c') => {
                let i = item.selected;
                item.judgements[i] = None;
                item.best = item.best.filter(|&b| b != i);
                item.second = item.second.filter(|&s| s != i);
            }
            Key::Enter => return self.submit(),
            Key::Char('n') => return Action::Skip(item.task.task_id),
            Key::Char('x') => return Action::Flag(item.task.task_id),
            _ => {}
        }
        Action::None
    }

    /// Labels the selected ending and moves to the next, so that labelling six endings takes six
    /// keys. Gibberish loses its best / second mark.
    fn judge(&mut self, judgement: Judgement) {
        let item = self.item.as_mut().expect("an item is on screen");
        let i = item.selected;
        item.judgements[i] = Some(judgement);
        item.selected = (i + 1).min(item.judgements.len() - 1);
        if judgement != Judgement::Gibberish {
            return;
        }
        if let Some(rank) = item.rank_of(i) {
            item.best = item.best.filter(|&b| b != i);
            item.second = item.second.filter(|&s| s != i);
            self.say(
                Tone::Warn,
                format!(
                    "ending {} was {}; gibberish cannot be ranked, mark removed",
                    i + 1,
                    rank.as_str()
                ),
            );
        }
    }

    /// Marks the selected ending best or second (again: unmarks it); one ending holds one mark.
    /// Giving the other mark to an ending that holds one swaps the two marks (the other ending,
    /// if any, takes this one's old mark), and the status line says what moved.
    fn rank(&mut self, rank: Rank) {
        let item = self.item.as_mut().expect("an item is on screen");
        let i = item.selected;
        if item.judgements[i] == Some(Judgement::Gibberish) {
            self.say(
                Tone::Warn,
                format!("ending {} is gibberish: it cannot be best or second", i + 1),
            );
            return;
        }
        let (mark, other) = match rank {
            Rank::Best => (&mut item.best, &mut item.second),
            Rank::Second => (&mut item.second, &mut item.best),
        };
        if *mark == Some(i) {
            *mark = None;
            return;
        }
        if *other != Some(i) {
            *mark = Some(i);
            return;
        }
        let previous = mark.replace(i);
        *other = previous;
        let other_rank = match rank {
            Rank::Best => Rank::Second,
            Rank::Second => Rank::Best,
        };
        let text = match previous {
            Some(p) => format!(
                "ending {} is now {} and ending {} {} (swapped)",
                i + 1,
                rank.as_str(),
                p + 1,
                other_rank.as_str()
            ),
            None => format!(
                "ending {} is now {} (it was {}): no ending is {} yet",
                i + 1,
                rank.as_str(),
                other_rank.as_str(),
                other_rank.as_str()
            ),
        };
        self.say(Tone::Info, text);
    }

    /// The item's labels when they are complete; otherwise what is missing, on the status line.
    fn submit(&mut self) -> Action {
        let item = self.item.as_ref().expect("an item is on screen");
        let problems = item.problems();
        if !problems.is_empty() {
            self.say(
                Tone::Warn,
                format!("not yet: {}", verdict::describe(&problems)),
            );
            return Action::None;
        }
        let ids: Vec<i64> = item.task.endings.iter().map(|e| e.ending_id).collect();
        Action::Submit {
            task_id: item.task.task_id,
            labels: verdict::labels(&ids, &item.judgements, item.best, item.second),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_store::annotate::tasks::TaskEnding;

    fn task(n: usize) -> TaskView {
        TaskView {
            task_id: 42,
            example_id: 7,
            ext_id: "v#1".into(),
            round: 0,
            replicas: 1,
            submitted: 0,
            open: true,
            sent1: "A man is in a kitchen.".into(),
            sent2: "He".into(),
            endings: (0..n)
                .map(|i| TaskEnding {
                    ending_id: 100 + i as i64,
                    text: format!("ending {i}."),
                    is_gold: i == 0,
                })
                .collect(),
        }
    }

    fn app(n: usize) -> App {
        let mut app = App::new("alice");
        app.show(Some(Item::new(task(n))));
        app
    }

    fn press(app: &mut App, keys: &str) -> Action {
        let mut last = Action::None;
        for c in keys.chars() {
            last = app.on_key(Key::Char(c));
        }
        last
    }

    fn item(app: &App) -> &Item {
        app.item.as_ref().unwrap()
    }

    #[test]
    fn labelling_moves_down_and_a_complete_item_submits() {
        let mut app = app(6);
        assert_eq!(press(&mut app, "lulugl"), Action::None);
        use Judgement::*;
        assert_eq!(
            item(&app).judgements,
            [Likely, Unlikely, Likely, Unlikely, Gibberish, Likely].map(Some)
        );
        assert_eq!(item(&app).selected, 5, "selection stops at the last ending");
        press(&mut app, "1b3s");
        match app.on_key(Key::Enter) {
            Action::Submit { task_id, labels } => {
                assert_eq!(task_id, 42);
                assert_eq!(labels.len(), 6);
                assert_eq!(labels[0].rank, Some(Rank::Best));
                assert_eq!(labels[2].rank, Some(Rank::Second));
                assert_eq!(labels[4].judgement, Gibberish);
                assert_eq!(labels[5].ending_id, 105);
            }
            other => panic!("expected a submission, got {other:?}"),
        }
    }

    #[test]
    fn enter_on_an_incomplete_item_says_what_is_missing() {
        let mut app = app(6);
        press(&mut app, "llll");
        assert_eq!(app.on_key(Key::Enter), Action::None);
        let msg = app.message.clone().unwrap();
        assert_eq!(msg.tone, Tone::Warn);
        assert_eq!(
            msg.text,
            "not yet: label endings 5, 6 · pick the best · pick the second best"
        );
    }

    #[test]
    fn marks_move_toggle_and_never_sit_on_gibberish() {
        let mut app = app(6);
        press(&mut app, "1b");
        assert_eq!(item(&app).best, Some(0));
        press(&mut app, "2b");
        assert_eq!(item(&app).best, Some(1), "best moves to the new ending");
        press(&mut app, "s");
        assert_eq!((item(&app).best, item(&app).second), (None, Some(1)));
        press(&mut app, "s");
        assert_eq!(item(&app).second, None, "s on the second toggles it off");
        press(&mut app, "3b3");
        press(&mut app, "g");
        assert_eq!(
            item(&app).best,
            None,
            "labelling the best gibberish removes the mark"
        );
        assert_eq!(app.message.as_ref().unwrap().tone, Tone::Warn);
        press(&mut app, "3b");
        assert_eq!(item(&app).best, None, "gibberish cannot be marked");
        app.on_key(Key::Backspace);
        assert_eq!(item(&app).judgements[2], None, "backspace clears the label");
    }

    #[test]
    fn a_second_mark_on_the_best_ending_swaps_and_says_so() {
        let mut app = app(6);
        press(&mut app, "lllllu1b3s");
        press(&mut app, "1s");
        assert_eq!((item(&app).best, item(&app).second), (Some(2), Some(0)));
        let said = &app.message.as_ref().unwrap().text;
        assert!(
            said.contains("ending 1 is now second and ending 3 best"),
            "{said}"
        );
        press(&mut app, "1b3c1s");
        assert_eq!((item(&app).best, item(&app).second), (None, Some(0)));
        let said = &app.message.as_ref().unwrap().text;
        assert!(said.contains("no ending is best yet"), "{said}");
    }

    #[test]
    fn keys_are_ignored_while_the_item_is_hidden_and_pastes_always() {
        let mut app = app(6);
        app.hidden = true;
        assert_eq!(press(&mut app, "llllllbzxn"), Action::None);
        assert_eq!(item(&app).judgements, vec![None; 6]);
        assert_eq!(app.on_key(Key::Enter), Action::None);
        assert_eq!(press(&mut app, "q"), Action::Quit);
        app.hidden = false;
        app.on_paste();
        assert!(app
            .message
            .as_ref()
            .unwrap()
            .text
            .contains("pasted text ignored"));
        assert_eq!(item(&app).judgements, vec![None; 6]);
    }

    #[test]
    fn navigation_stays_in_bounds() {
        let mut app = app(4);
        app.on_key(Key::Up);
        assert_eq!(item(&app).selected, 0);
        for _ in 0..10 {
            app.on_key(Key::Down);
        }
        assert_eq!(item(&app).selected, 3);
        press(&mut app, "6");
        assert_eq!(item(&app).selected, 3, "there is no ending 6 of 4");
        assert!(app.message.is_some());
        app.on_key(Key::Home);
        assert_eq!(item(&app).selected, 0);
    }

    #[test]
    fn skip_flag_undo_quit_and_help() {
        let mut app = app(6);
        assert_eq!(press(&mut app, "n"), Action::Skip(42));
        assert_eq!(press(&mut app, "x"), Action::Flag(42));
        assert_eq!(press(&mut app, "z"), Action::Undo);
        assert_eq!(press(&mut app, "?"), Action::None);
        assert!(app.help.is_some());
        app.help.as_mut().unwrap().max_scroll = 15;
        app.on_key(Key::PageDown);
        app.on_key(Key::PageDown);
        assert_eq!(app.help.unwrap().scroll, 15, "scrolling stops at the end");
        assert_eq!(press(&mut app, "q"), Action::None, "q closes help first");
        assert!(app.help.is_none());
        assert_eq!(press(&mut app, "q"), Action::Quit);
        assert_eq!(app.on_key(Key::CtrlC), Action::Quit);
    }

    #[test]
    fn with_nothing_left_only_quit_undo_and_help_act() {
        let mut app = App::new("bob");
        assert_eq!(press(&mut app, "l"), Action::None);
        assert!(app.message.as_ref().unwrap().text.contains("nothing left"));
        assert_eq!(press(&mut app, "z"), Action::Undo);
        assert_eq!(press(&mut app, "q"), Action::Quit);
    }

    #[test]
    fn an_undone_item_comes_back_with_its_labels() {
        let labels = vec![
            EndingLabel {
                ending_id: 101,
                judgement: Judgement::Likely,
                rank: Some(Rank::Best),
            },
            EndingLabel {
                ending_id: 100,
                judgement: Judgement::Unlikely,
                rank: Some(Rank::Second),
            },
        ];
        let item = Item::with_labels(task(2), &labels);
        assert_eq!(item.best, Some(1));
        assert_eq!(item.second, Some(0));
        assert!(item.problems().is_empty());
    }
}
