//! `lm adapt`'s table: the generator's adapters, one row per fold of a set.

use anyhow::Result;
use rusqlite::{params, OptionalExtension};

use super::{now, Store};

/// One fold's adapter, as recorded once its file is complete.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AdapterRecord {
    pub model_sha256: String,
    /// Every setting of the set and its seed (JSON); the rows of one set share it.
    pub settings_json: String,
    pub folds: usize,
    pub fold: usize,
    /// The safetensors file, relative to the project's folder.
    pub path: String,
    pub sha256: String,
    pub train_tokens: usize,
    pub heldout_loss_base: f64,
    pub heldout_loss_adapted: f64,
    pub seconds: f64,
}

const COLUMNS: &str = "model_sha256, settings_json, folds, fold, path, sha256, train_tokens, \
                       heldout_loss_base, heldout_loss_adapted, seconds";

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AdapterRecord> {
    Ok(AdapterRecord {
        model_sha256: r.get(0)?,
        settings_json: r.get(1)?,
        folds: r.get::<_, i64>(2)? as usize,
        fold: r.get::<_, i64>(3)? as usize,
        path: r.get(4)?,
        sha256: r.get(5)?,
        train_tokens: r.get::<_, i64>(6)? as usize,
        heldout_loss_base: r.get(7)?,
        heldout_loss_adapted: r.get(8)?,
        seconds: r.get(9)?,
    })
}

impl Store {
    /// Records a fold's finished adapter (its file already written in full).
    pub fn record_adapter(&self, a: &AdapterRecord) -> Result<()> {
        self.conn.execute(
            &format!("INSERT INTO adapters ({COLUMNS}, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
            params![
                a.model_sha256,
                a.settings_json,
                a.folds as i64,
                a.fold as i64,
                a.path,
                a.sha256,
                a.train_tokens as i64,
                a.heldout_loss_base,
                a.heldout_loss_adapted,
                a.seconds,
                now()
            ],
        )?;
        Ok(())
    }

    /// Forgets a fold's adapter whose file is gone or changed, so that it can be trained again.
    pub fn forget_adapter(&self, a: &AdapterRecord) -> Result<()> {
        self.conn.execute(
            "DELETE FROM adapters WHERE model_sha256 = ?1 AND settings_json = ?2 AND fold = ?3",
            params![a.model_sha256, a.settings_json, a.fold as i64],
        )?;
        Ok(())
    }

    /// The adapters of the set made with `settings_json` for the model `model_sha256`, by fold.
    pub fn adapter_set(
        &self,
        model_sha256: &str,
        settings_json: &str,
    ) -> Result<Vec<AdapterRecord>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM adapters WHERE model_sha256 = ?1 AND settings_json = ?2 ORDER BY fold"
        ))?;
        let rows = stmt
            .query_map(params![model_sha256, settings_json], from_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// The most recently finished complete set of adapters for the model `model_sha256`: every
    /// fold present. `None` when the project has none.
    pub fn latest_adapter_set(&self, model_sha256: &str) -> Result<Option<Vec<AdapterRecord>>> {
        let settings: Option<String> = self
            .conn
            .query_row(
                "SELECT settings_json FROM adapters WHERE model_sha256 = ?1
                 GROUP BY settings_json HAVING COUNT(DISTINCT fold) = MAX(folds)
                 ORDER BY MAX(id) DESC LIMIT 1",
                params![model_sha256],
                |r| r.get(0),
            )
            .optional()?;
        settings
            .map(|s| self.adapter_set(model_sha256, &s))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(settings: &str, fold: usize) -> AdapterRecord {
        AdapterRecord {
            model_sha256: "m".into(),
            settings_json: settings.into(),
            folds: 2,
            fold,
            path: format!("adapters/{settings}-{fold}.safetensors"),
            sha256: "h".into(),
            train_tokens: 10,
            heldout_loss_base: 3.0,
            heldout_loss_adapted: 2.5,
            seconds: 1.0,
        }
    }

    #[test]
    fn only_complete_sets_are_used_and_the_newest_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        assert_eq!(store.latest_adapter_set("m").unwrap(), None);
        store.record_adapter(&record("a", 0)).unwrap();
        assert_eq!(store.latest_adapter_set("m").unwrap(), None);
        store.record_adapter(&record("a", 1)).unwrap();
        let set = store.latest_adapter_set("m").unwrap().unwrap();
        assert_eq!(set.iter().map(|a| a.fold).collect::<Vec<_>>(), [0, 1]);
        store.record_adapter(&record("b", 0)).unwrap();
        assert_eq!(
            store.latest_adapter_set("m").unwrap().unwrap()[0].settings_json,
            "a"
        );
        store.record_adapter(&record("b", 1)).unwrap();
        assert_eq!(
            store.latest_adapter_set("m").unwrap().unwrap()[0].settings_json,
            "b"
        );
        assert_eq!(store.latest_adapter_set("other").unwrap(), None);
        assert!(
            store.record_adapter(&record("b", 1)).is_err(),
            "a fold is recorded once"
        );
    }
}
