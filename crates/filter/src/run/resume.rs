//! Which run a `filter` call works on: the latest run resumed when it stopped with the same
//! settings and pools, nothing when it finished that way, a new run with its initial draw
//! otherwise.

use anyhow::{bail, Result};

use super::config::{differing_keys, Config, RunParams};
use super::observer::Observer;
use crate::algorithm::{initial_draw, INITIAL_STREAM};
use crate::data::Dataset;
use afkit_store::af::{AfRun, Assignment};
use afkit_store::Store;

/// What becomes of the latest run.
enum Latest {
    /// Unfinished with these settings and pools: carry it on.
    Resume,
    /// Finished with these settings on these pools: nothing to do.
    UpToDate,
    /// A new run replaces it.
    Replace,
}

/// Picks the run to work on: resumes an unfinished run with the same parameters and pools,
/// starts a new one when asked or when the pools changed, and returns `None` when the latest run
/// is finished and up to date.
pub(crate) fn resolve_run(
    store: &mut Store,
    params: &RunParams,
    fingerprint: &str,
    data: &Dataset,
    observer: &mut dyn Observer,
) -> Result<Option<AfRun>> {
    let params_json = serde_json::to_value(params)?;
    if let Some(latest) = store.latest_af_run()? {
        match judge_latest(&latest, params, &params_json, fingerprint, observer)? {
            Latest::Resume => {
                let done = store.af_iterations(latest.id)?.len();
                observer.note(&format!(
                    "resuming AF run {} after {done} finished iterations",
                    latest.id
                ));
                return Ok(Some(latest));
            }
            Latest::UpToDate => return Ok(None),
            Latest::Replace => {}
        }
    }
    let config = &params.config;
    let initial = initial_assignment(data, config);
    let params_text = params_json.to_string();
    let run = store.start_af_run(config.k, config.seed, &params_text, fingerprint, &initial)?;
    Ok(Some(run))
}

/// Compares the latest run with this call's settings and pools, saying why when it is not
/// resumed; refuses to abandon an unfinished run unless `--new-run` asks for it.
fn judge_latest(
    run: &AfRun,
    params: &RunParams,
    params_json: &serde_json::Value,
    fingerprint: &str,
    observer: &mut dyn Observer,
) -> Result<Latest> {
    let same_pools = run.pool_fingerprint == fingerprint;
    let stored: serde_json::Value = serde_json::from_str(&run.params)?;
    let differing = differing_keys(&stored, params_json).join(", ");
    Ok(
        match (&run.finished_at, params.config.new_run, same_pools) {
            (None, false, true) if differing.is_empty() => Latest::Resume,
            (None, false, true) => bail!(
                "AF run {} is unfinished and was started with other settings ({differing}); rerun \
             with its settings to continue it, or pass --new-run to start over",
                run.id,
            ),
            (None, false, false) => bail!(
                "the pools changed since unfinished AF run {} started; pass --new-run to start \
             a new run on the current pools",
                run.id
            ),
            (Some(_), false, true) if !differing.is_empty() => {
                observer.note(&format!(
                    "AF run {} finished with other settings ({differing}); starting a new run",
                    run.id,
                ));
                Latest::Replace
            }
            (Some(finished), false, true) => {
                observer.note(&format!(
                    "AF run {} finished at {finished} on the current pools; nothing to do \
                 (pass --new-run to run AF again)",
                    run.id
                ));
                Latest::UpToDate
            }
            (Some(_), false, false) => {
                observer.note(&format!(
                "the pools changed since AF run {} (contexts or endings were added or replaced, or \
                 reviews vetoed endings); starting a new run",
                run.id
            ));
                Latest::Replace
            }
            (_, true, _) => Latest::Replace,
        },
    )
}

/// Every context's k distinct pool endings, drawn from the run's initial stream.
fn initial_assignment(data: &Dataset, config: &Config) -> Assignment {
    let mut rng = config.seed.stream(INITIAL_STREAM);
    data.contexts
        .iter()
        .map(|c| {
            let ids: Vec<i64> = c.candidates.iter().map(|e| e.ending_id).collect();
            (c.example_id, initial_draw(&ids, config.k, &mut rng))
        })
        .collect()
}
