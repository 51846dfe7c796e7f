//! `afkit generate --backend openai` end to end against an in-process completions server on
//! loopback (std TcpListener, port 0, stops by itself), including its fault modes: 5xx, 429 with
//! Retry-After, hangs, dropped connections, malformed JSON. One ignored test runs against a real
//! server named by `AFKIT_OPENAI_TEST_URL`.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use afkit_engine::lm::features::TokenScorer;
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::model::LanguageModel;
use afkit_engine::lm::sampler::SamplingParams;
use common::{command, examples_project, query_i64, succeeded, tiny_gguf};
use serde_json::{json, Value};

/// What the fake server does with one request.
enum Reply {
    /// A completions response for the request.
    Complete,
    Status(u16, Option<u64>),
    /// Sleep this long, then close without answering.
    Hang(Duration),
    /// Send half a response, then close.
    Cut,
    Malformed,
}

type Behaviour = dyn Fn(usize, &Value) -> Reply + Send + Sync;

/// Every request body the fake server saw, with its Authorization header.
type RequestLog = Arc<Mutex<Vec<(Value, Option<String>)>>>;

struct FakeServer {
    url: String,
    stop: Arc<AtomicBool>,
    requests: RequestLog,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

const VERBS: [&str; 6] = ["walks", "runs", "jumps", "sits", "waves", "looks"];
const PLACES: [&str; 6] = [
    "the door",
    "a table",
    "the window",
    "his dog",
    "her bag",
    "the car",
];

/// One of 36 canned completions, picked by `variant` (the server derives it from the request's
/// seed), tokenised by the scoring model so that its log-probs line up; the stop string is cut
/// from the text but kept in the token log, as llama-cpp-python's server does.
fn completion(tok: &afkit_engine::lm::tokenizer::GgufTokenizer, variant: u64) -> Value {
    let ending = format!(
        " {} to {}.",
        VERBS[(variant % 6) as usize],
        PLACES[(variant / 6 % 6) as usize]
    );
    let ids = tok.encode(&ending).unwrap();
    let tokens: Vec<String> = ids.iter().map(|&i| tok.decode(&[i]).unwrap()).collect();
    json!({
        "text": ending.trim_end_matches('.'),
        "finish_reason": "stop",
        "logprobs": {"tokens": tokens, "token_logprobs": vec![-0.25; ids.len()]},
    })
}

/// An echo request's answer as vLLM gives it: each prompt (token ids, the first the
/// document-start token) with the log-prob of every token but the first, computed by the scoring
/// model itself, then one generated token.
fn echo(lm: &LocalLm, body: &Value) -> Value {
    let choices: Vec<Value> = body["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(index, prompt)| {
            let ids: Vec<u32> = prompt
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(ids[0], lm.model.tokenizer.doc_start, "a prompt starts a document");
            let logprobs = lm.alone(&[&ids[1..]]).unwrap().remove(0);
            let mut tokens: Vec<String> = ids
                .iter()
                .map(|&i| lm.model.tokenizer.decode(&[i]).unwrap())
                .collect();
            tokens.push(" x".into());
            let mut values = vec![Value::Null];
            values.extend(logprobs.iter().map(|&lp| json!(lp)));
            values.push(json!(-0.5));
            json!({"index": index, "text": "", "logprobs": {"tokens": tokens, "token_logprobs": values}})
        })
        .collect();
    json!({"choices": choices})
}

fn read_request(stream: &mut TcpStream) -> Option<(Value, Option<String>)> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream);
    let (mut length, mut auth) = (0, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "authorization" => auth = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((serde_json::from_slice(&body).ok()?, auth))
}

fn respond(stream: &mut TcpStream, status: u16, extra: &str, body: &str) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    );
}

/// Serves on 127.0.0.1 until dropped or 60 s have passed.
fn serve(scorer: &Path, behaviour: Arc<Behaviour>) -> FakeServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let model = Arc::new(LocalLm::new(
        LanguageModel::load(scorer).unwrap(),
        SamplingParams::default(),
        None,
    ));
    let count = Arc::new(AtomicUsize::new(0));
    let (stop2, requests2) = (stop.clone(), requests.clone());
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
            let Ok((mut stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            let (behaviour, requests, model, count) = (
                behaviour.clone(),
                requests2.clone(),
                model.clone(),
                count.clone(),
            );
            std::thread::spawn(move || {
                stream.set_nonblocking(false).unwrap();
                let Some((body, auth)) = read_request(&mut stream) else {
                    return;
                };
                let i = count.fetch_add(1, Ordering::SeqCst);
                requests.lock().unwrap().push((body.clone(), auth));
                match behaviour(i, &body) {
                    Reply::Complete if body["echo"] == true => {
                        respond(&mut stream, 200, "", &echo(&model, &body).to_string());
                    }
                    Reply::Complete => {
                        let tokenizer = &model.model.tokenizer;
                        let seed = body["seed"].as_u64().unwrap_or(i as u64);
                        let n = body["n"].as_u64().unwrap_or(1);
                        let choices: Vec<Value> = (0..n)
                            .map(|k| completion(tokenizer, seed.wrapping_add(k * 7)))
                            .collect();
                        respond(
                            &mut stream,
                            200,
                            "",
                            &json!({"choices": choices}).to_string(),
                        );
                    }
                    Reply::Status(code, retry_after) => {
                        let header = retry_after
                            .map(|s| format!("Retry-After: {s}\r\n"))
                            .unwrap_or_default();
                        respond(&mut stream, code, &header, "{\"error\": \"busy\"}");
                    }
                    Reply::Hang(d) => std::thread::sleep(d),
                    Reply::Cut => {
                        let _ = stream.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"choices\": [{\"te",
                        );
                    }
                    Reply::Malformed => respond(&mut stream, 200, "", "{\"choices\": [{\"text\""),
                }
            });
        }
    });
    FakeServer {
        url,
        stop,
        requests,
    }
}

/// A project with `n` examples (ingest's job is not under test here, so they go in through the
/// store).
fn project(dir: &Path, n: usize) -> PathBuf {
    let examples: Vec<_> = (0..n)
        .map(|i| {
            (
                format!("ex{i}"),
                format!("A man number {i} stands in a large bright kitchen."),
                "The man".into(),
                "slowly walks to the sink and washes a cup.".into(),
            )
        })
        .collect();
    examples_project(dir, &examples)
}

fn generate(project: &Path, scorer: &Path, urls: &[&str], extra: &[&str]) -> std::process::Output {
    let mut cmd = command();
    cmd.arg("generate")
        .arg(project)
        .args(["--backend", "openai", "--model"])
        .arg(scorer)
        .args([
            "--n-neg",
            "4",
            "--json",
            "--retries",
            "3",
            "--backoff",
            "0.01",
        ])
        // Every feature, the ending-alone scores included, comes from the server.
        .args(["--request-timeout", "0.5", "--alone-scores"]);
    for url in urls {
        cmd.args(["--endpoint", url]);
    }
    cmd.args(extra).output().unwrap()
}

/// The JSON summary of a generate run that must have succeeded.
fn ok_summary(out: std::process::Output) -> Value {
    serde_json::from_str(&succeeded(out)).unwrap()
}

/// The fake server got work, and each of its sampling requests carried the key and asked for
/// seeded, untruncated temperature-1 sampling after the context.
fn check_sampling_requests(server: &FakeServer) {
    let requests = server.requests.lock().unwrap();
    assert!(!requests.is_empty());
    // Echo requests (the LM features, from this server since it answers them) aside.
    for (body, auth) in requests.iter().filter(|(body, _)| body["echo"] != true) {
        assert_eq!(auth.as_deref(), Some("Bearer sk-test-123"));
        assert_eq!(body["temperature"], 1.5);
        assert_eq!(body["top_p"], 1.0);
        assert_eq!(body["top_k"], 0);
        assert!(
            (body["min_p"].as_f64().unwrap() - 0.1).abs() < 1e-6,
            "{body}"
        );
        assert_eq!(body["max_tokens"], 40);
        assert_eq!(body["stop"], json!(["."]));
        assert!(body["seed"].is_u64());
        assert!(body["prompt"]
            .as_str()
            .unwrap()
            .ends_with("kitchen. The man"));
    }
}

/// Every ending stored in `project` has its LM features (from the server, which echoes prompt
/// log-probs), and the generated ones are unique per context and sentence-complete.
fn check_complete_endings(project: &Path) {
    let missing = query_i64(
        project,
        "SELECT COUNT(*) FROM endings WHERE (lp_cond IS NULL OR lp_alone IS NULL)
         AND example_id IN (SELECT example_id FROM pools)",
    );
    assert_eq!(missing, 0);
    // Endings are unique per context and sentence-complete.
    assert_eq!(
        query_i64(
            project,
            "SELECT COUNT(*) FROM (SELECT example_id, text FROM endings WHERE is_gold = 0
             GROUP BY example_id, text HAVING COUNT(*) > 1)"
        ),
        0
    );
    assert_eq!(
        query_i64(
            project,
            "SELECT COUNT(*) FROM endings WHERE is_gold = 0 AND text NOT LIKE '%.'"
        ),
        0
    );
}

#[test]
fn generates_over_two_endpoints_with_server_logprobs_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let project = project(dir.path(), 3);
    let a = serve(&scorer, Arc::new(|_, _| Reply::Complete));
    let b = serve(&scorer, Arc::new(|_, _| Reply::Complete));
    let out = generate(
        &project,
        &scorer,
        &[&a.url, &b.url],
        &["--api-key-env", "AFKIT_TEST_KEY", "--limit", "2"],
    );
    // The key variable is not set: a clear error before anything is sent.
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AFKIT_TEST_KEY"));

    let out = command()
        .env("AFKIT_TEST_KEY", "sk-test-123")
        .arg("generate")
        .arg(&project)
        .arg("--alone-scores")
        .args(["--backend", "openai", "--model"])
        .arg(&scorer)
        .args(["--endpoint", &a.url, "--endpoint", &b.url])
        .args([
            "--api-key-env",
            "AFKIT_TEST_KEY",
            "--n-neg",
            "4",
            "--limit",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    let summary = ok_summary(out);
    assert_eq!(summary["contexts"], 2);
    assert_eq!(summary["endings"], 8);
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM pools"), 2);
    // Both servers got work; every request asks for untruncated temperature-1 sampling.
    check_sampling_requests(&a);
    check_sampling_requests(&b);
    check_complete_endings(&project);
    // The key is never stored; the recorded params name the server and the scorer.
    let params: String = rusqlite::Connection::open(&project)
        .unwrap()
        .query_row(
            "SELECT params FROM generations ORDER BY id LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!params.contains("sk-test-123"));
    assert!(params.contains(&a.url) && params.contains("scorer"));
    // Resume: the third context only.
    let summary = ok_summary(generate(&project, &scorer, &[&b.url], &[]));
    assert_eq!(summary["contexts"], 1);
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM pools"), 3);
}

#[test]
fn server_errors_and_rate_limits_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let project = project(dir.path(), 1);
    // The first two requests get a 500, the third a 429 asking for a 1 s pause.
    let server = serve(
        &scorer,
        Arc::new(|i, _| match i {
            0 | 1 => Reply::Status(500, None),
            2 => Reply::Status(429, Some(1)),
            _ => Reply::Complete,
        }),
    );
    let started = Instant::now();
    let summary = ok_summary(generate(
        &project,
        &scorer,
        &[&server.url],
        &["--concurrency", "1"],
    ));
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After ignored"
    );
    assert_eq!(summary["endings"], 4);
    assert!(summary["server_retries"].as_u64().unwrap() >= 3);
}

#[test]
fn hangs_and_dropped_connections_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let project = project(dir.path(), 1);
    let server = serve(
        &scorer,
        Arc::new(|i, _| match i {
            0 => Reply::Hang(Duration::from_secs(3)),
            1 => Reply::Cut,
            _ => Reply::Complete,
        }),
    );
    let started = Instant::now();
    let summary = ok_summary(generate(
        &project,
        &scorer,
        &[&server.url],
        &["--concurrency", "1"],
    ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the timeout did not fire"
    );
    assert_eq!(summary["endings"], 4);
    assert!(summary["server_retries"].as_u64().unwrap() >= 2);
}

#[test]
fn a_failing_context_is_reported_and_never_stored_partially() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let project = project(dir.path(), 2);
    // ex0 is served; every request for ex1 gets malformed JSON, after some good answers.
    let server = serve(
        &scorer,
        Arc::new(|i, body: &Value| {
            // The context is the prompt's last line (style examples from other contexts come
            // before it).
            let Some(prompt) = body["prompt"].as_str() else {
                return Reply::Complete; // an echo request (the LM features)
            };
            let context = prompt.lines().last().unwrap();
            let for_ex1 = context.contains("number 1 ");
            if for_ex1 && i % 3 != 0 {
                Reply::Malformed
            } else {
                Reply::Complete
            }
        }),
    );
    let out = generate(&project, &scorer, &[&server.url], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ex1"), "{stderr}");
    assert!(stderr.contains("malformed"), "{stderr}");
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM pools"), 1);
    assert_eq!(
        query_i64(
            &project,
            "SELECT COUNT(*) FROM endings e JOIN examples x ON x.id = e.example_id
             WHERE e.is_gold = 0 AND x.ext_id = 'ex1'"
        ),
        0
    );
    assert_eq!(
        query_i64(&project, "SELECT COUNT(*) FROM endings WHERE is_gold = 0"),
        4
    );
}

/// Against a real OpenAI-compatible server, e.g. llama.cpp's server on the SmolLM2 GGUF:
/// `AFKIT_OPENAI_TEST_URL=http://127.0.0.1:8089 cargo test --release real_server -- --ignored`.
#[test]
#[ignore = "needs a running completions server named in AFKIT_OPENAI_TEST_URL; run with --ignored"]
fn real_server_generates_a_pool() {
    let url = std::env::var("AFKIT_OPENAI_TEST_URL")
        .expect("AFKIT_OPENAI_TEST_URL names the server this test generates with");
    afkit_engine::models::DefaultModel::SmolLm2
        .ensure()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path(), 2);
    let out = command()
        .arg("generate")
        .arg(&project)
        .arg("--alone-scores")
        .args([
            "--backend",
            "openai",
            "--endpoint",
            &url,
            "--n-neg",
            "8",
            "--json",
        ])
        .output()
        .unwrap();
    let summary = ok_summary(out);
    assert_eq!(summary["contexts"], 2);
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM pools"), 2);
    assert!(summary["endings"].as_u64().unwrap() > 8);
}

/// The fold of a context of the test project ("A man number I stands ...": its group is exI).
fn fold_of_context(context: &str) -> usize {
    let i: usize = context.split_whitespace().nth(3).unwrap().parse().unwrap();
    afkit_store::dataset::group_fold(afkit_engine::seed::Seed::new(5), &format!("ex{i}"), 2)
}

/// The context a request is for: the sampling prompt's last one, or for an echo request (the
/// LM features) the one its first prompt's tokens spell, if any (endings alone have none).
fn requested_context(
    tokenizer: &afkit_engine::lm::tokenizer::GgufTokenizer,
    body: &Value,
) -> Option<String> {
    let prompt = match body["prompt"].as_str() {
        Some(text) => text.to_string(),
        None => {
            let ids: Vec<u32> = body["prompt"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            tokenizer.decode(&ids).unwrap()
        }
    };
    let at = prompt.rfind("A man number")?;
    Some(prompt[at..].to_string())
}

/// The project's pools belong to one generation per fold, each recording its fold's adapter.
fn check_a_generation_per_fold(project: &Path) {
    let generations = query_i64(project, "SELECT COUNT(DISTINCT generation_id) FROM pools");
    assert_eq!(generations, 2, "one generation per fold");
    let conn = rusqlite::Connection::open(project).unwrap();
    let params: Vec<String> = conn
        .prepare("SELECT params FROM generations ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (fold, p) in params.iter().enumerate() {
        let p: Value = serde_json::from_str(p).unwrap();
        assert_eq!(
            p["server"]["fold_adapter"]["model"],
            format!("fold{fold}"),
            "{p}"
        );
    }
}

/// Per-fold routing: with the project's fold adapters (`lm adapt`) served by name
/// (`--adapter-names fold{fold}`, as vLLM's `--lora-modules`) every request of a context asks
/// for its fold's adapter, and with llama.cpp's adapter numbers (`--adapter-lora-ids`) it
/// applies that adapter alone; each fold's pools belong to a generation of their own that
/// records the routing. Without adapters the flags are refused.
#[test]
fn each_context_is_sampled_by_its_folds_adapter_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let project = project(dir.path(), 8);
    let server = serve(&scorer, Arc::new(|_, _| Reply::Complete));
    let refused = generate(
        &project,
        &scorer,
        &[&server.url],
        &["--adapter-names", "fold{fold}"],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("lm adapt"));

    let adapted = common::lm_adapt(&project, &scorer, 2).output().unwrap();
    succeeded(adapted);
    let tokenizer = LanguageModel::load(&scorer).unwrap().tokenizer;
    let context_of = |body: &Value| requested_context(&tokenizer, body);

    let out = generate(
        &project,
        &scorer,
        &[&server.url],
        &[
            "--limit",
            "4",
            "--style-examples",
            "0",
            "--adapter-names",
            "fold{fold}",
        ],
    );
    assert_eq!(ok_summary(out)["contexts"], 4);
    let mut folds_seen = std::collections::BTreeSet::new();
    let folds = ["fold0", "fold1"].map(Value::from);
    for (body, _) in server.requests.lock().unwrap().iter() {
        assert!(folds.contains(&body["model"]), "{body}");
        let Some(context) = context_of(body) else {
            continue;
        };
        let fold = fold_of_context(&context);
        assert_eq!(body["model"], format!("fold{fold}"), "{body}");
        folds_seen.insert(fold);
    }
    assert_eq!(folds_seen.len(), 2, "both folds were sampled");
    check_a_generation_per_fold(&project);

    server.requests.lock().unwrap().clear();
    let out = generate(
        &project,
        &scorer,
        &[&server.url],
        &[
            "--limit",
            "4",
            "--style-examples",
            "0",
            "--adapter-lora-ids",
        ],
    );
    assert_eq!(ok_summary(out)["contexts"], 4);
    for (body, _) in server.requests.lock().unwrap().iter() {
        let Some(context) = context_of(body) else {
            assert!(body["lora"][0]["id"].is_u64(), "{body}");
            continue;
        };
        let fold = fold_of_context(&context);
        assert_eq!(body["lora"], json!([{"id": fold, "scale": 1.0}]), "{body}");
    }
}

/// The LM features of every ending of `project`, by context and text.
fn stored_features(project: &Path) -> Vec<(String, f64, f64, Option<f64>, i64)> {
    let conn = rusqlite::Connection::open(project).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT x.ext_id || '/' || e.text, e.lp_cond, e.lp_alone, e.lp_final_punct,
                    e.n_tok_ending
             FROM endings e JOIN examples x ON x.id = e.example_id ORDER BY 1",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// The features the `server` project got from the server equal those the `local` project
/// computed, ending by ending and for the contexts, to within rounding.
fn check_features_agree(server: &Path, local: &Path) {
    let (a, b) = (stored_features(server), stored_features(local));
    assert_eq!(a.len(), b.len());
    assert!(a.len() >= 10, "gold and sampled endings of two contexts");
    let close = |x: f64, y: f64| (x - y).abs() < 1e-4;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((&x.0, x.4), (&y.0, y.4));
        assert!(close(x.1, y.1) && close(x.2, y.2), "{x:?} vs {y:?}");
        assert_eq!(x.3.is_some(), y.3.is_some());
        assert!(
            close(x.3.unwrap_or(0.0), y.3.unwrap_or(0.0)),
            "{x:?} vs {y:?}"
        );
    }
    let ctx = |p: &Path| {
        query_i64(
            p,
            "SELECT CAST(SUM(ctx_logprob) * 1e4 AS INTEGER) FROM pools",
        )
    };
    assert!((ctx(server) - ctx(local)).abs() <= 2);
}

/// The features a server gives (echoed prompt log-probs, as vLLM answers) equal the local
/// model's where the server runs the same model; a server that refuses `echo` (llama.cpp's
/// answers 400) leaves them to the local model with a note, and `--features server` then stops
/// before anything is stored.
#[test]
fn lm_features_come_from_a_server_that_echoes_and_equal_local_scoring() {
    let dir = tempfile::tempdir().unwrap();
    let scorer = tiny_gguf(dir.path(), 32, 1);
    let echoing = serve(&scorer, Arc::new(|_, _| Reply::Complete));
    let refusing = serve(
        &scorer,
        Arc::new(|_, body: &Value| {
            if body["echo"] == true {
                Reply::Status(400, None)
            } else {
                Reply::Complete
            }
        }),
    );
    let run = |name: &str, url: &str, features: &str| {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let project = project(&sub, 2);
        let out = generate(&project, &scorer, &[url], &["--features", features]);
        (project, out)
    };
    let (from_server, out) = run("server", &echoing.url, "server");
    succeeded(out);
    let echoes = echoing
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|(body, _)| body["echo"] == true)
        .count();
    assert!(echoes >= 3, "the probe, and the context's endings scored");
    let (local, out) = run("local", &echoing.url, "local");
    succeeded(out);

    check_features_agree(&from_server, &local);

    let (refused, out) = run("refused", &refusing.url, "server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--features server") && stderr.contains("400"),
        "{stderr}"
    );
    assert_eq!(query_i64(&refused, "SELECT COUNT(*) FROM pools"), 0);
    let (fallback, out) = run("fallback", &refusing.url, "auto");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    succeeded(out);
    assert!(stderr.contains("scored locally"), "{stderr}");
    assert_eq!(stored_features(&fallback), stored_features(&local));
}

/// llama.cpp's server, started with the default model on loopback.
struct LlamaServer {
    child: std::process::Child,
    url: String,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LlamaServer {
    /// `llama-server` on a free loopback port with `slots` parallel slots and `loras` loaded
    /// unapplied, once it answers its health check.
    fn start(model: &Path, slots: usize, loras: &[PathBuf]) -> LlamaServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new("llama-server");
        cmd.arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--parallel", &slots.to_string(), "-c", "2048", "-t", "2"]);
        if !loras.is_empty() {
            // One --lora with the files comma-separated: a repeated flag keeps only the last.
            let list: Vec<String> = loras.iter().map(|p| p.display().to_string()).collect();
            cmd.args(["--lora-init-without-apply", "--lora", &list.join(",")]);
        }
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = LlamaServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = write!(
                    stream,
                    "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                );
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.1 200") {
                    return server;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("llama-server did not become healthy in 120 s");
    }
}

/// The real engine: llama.cpp's server with two slots and the project's fold adapters (`lm
/// adapt`'s GGUF LoRA files, loaded unapplied), sampling each context with its fold's adapter
/// (`--adapter-lora-ids`). Its `echo` refusal leaves the LM features to the local model, said in
/// a note and in the generation's record.
#[test]
#[cfg_attr(
    not(has_llama_server),
    ignore = "needs llama.cpp's llama-server on PATH (scripts/bench_server.sh --build-only builds one): absent"
)]
#[cfg_attr(
    all(has_llama_server, offline),
    ignore = "needs the default model, and AFKIT_TEST_OFFLINE is set"
)]
fn llama_server_samples_each_fold_with_its_adapter() {
    let model_dir = afkit_engine::models::DefaultModel::SmolLm2
        .ensure()
        .unwrap();
    let model = std::fs::read_dir(&model_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Real captions (the built-in sample): the model continues them with verb phrases.
    let project = dir.path().join("p.sqlite");
    succeeded(command().arg("init").arg(&project).output().unwrap());
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/sample/captions.json");
    let ingest = command()
        .arg("ingest")
        .arg(&project)
        .args(["--format", "activitynet"])
        .arg(&sample)
        .output()
        .unwrap();
    succeeded(ingest);
    succeeded(common::lm_adapt(&project, &model, 2).output().unwrap());
    let mut loras: Vec<PathBuf> = std::fs::read_dir(project.with_extension("adapters"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".lora.gguf"))
        .collect();
    loras.sort();
    assert_eq!(loras.len(), 2, "one GGUF LoRA file per fold");
    let server = LlamaServer::start(&model, 2, &loras);
    let out = command()
        .arg("generate")
        .arg(&project)
        .arg("--alone-scores")
        .args(["--backend", "openai", "--endpoint", &server.url, "--model"])
        .arg(&model)
        .args(["--adapter-lora-ids", "--concurrency", "2", "--n-neg", "6"])
        .args(["--limit", "6", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let summary = ok_summary(out);
    assert_eq!(summary["contexts"], 6, "{stderr}");
    assert!(summary["endings"].as_u64().unwrap() >= 24, "{summary}");
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM pools"), 6);
    assert!(stderr.contains("scored locally"), "{stderr}");
    assert_eq!(
        query_i64(
            &project,
            "SELECT COUNT(*) FROM endings WHERE lp_alone IS NULL
             AND example_id IN (SELECT example_id FROM pools)"
        ),
        0
    );
    // Each fold's pools are a generation that records the adapter the server applied.
    let conn = rusqlite::Connection::open(&project).unwrap();
    let mut stmt = conn
        .prepare("SELECT params FROM generations WHERE id IN (SELECT generation_id FROM pools)")
        .unwrap();
    let params: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!params.is_empty());
    for p in params {
        let p: Value = serde_json::from_str(&p).unwrap();
        assert!(p["server"]["fold_adapter"]["lora"][0]["id"].is_u64(), "{p}");
    }
}
