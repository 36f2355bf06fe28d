//! Where pipelines come from: a folder of `NAME.toml` files (what `serve`
//! works and what commands look names up in). Loading checks a pipeline
//! whole before any database is opened, so a configuration error touches
//! nothing.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use tidemark_core::{Error, Pipeline};

/// A folder of pipeline files.
#[derive(Debug, Clone)]
pub struct Catalog {
    dir: PathBuf,
}

impl Catalog {
    /// The pipelines of `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Catalog {
        Catalog { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `NAME` → `DIR/NAME.toml`; anything ending in `.toml` (or holding a
    /// `/`) is a path.
    pub fn path_of(&self, name: &str) -> PathBuf {
        if name.ends_with(".toml") || name.contains('/') {
            PathBuf::from(name)
        } else {
            self.dir.join(format!("{name}.toml"))
        }
    }

    /// Loads and checks a pipeline, without its secrets: what only reading
    /// or tidying the ledger needs (`status`). An unset `${NAME}` matters
    /// only to what contacts the source.
    ///
    /// The clock is part of the configuration: a schedule that does not
    /// fire after `now` is an error here, before any database is opened.
    pub fn load(&self, name: &str, now: DateTime<Utc>) -> Result<Pipeline, Error> {
        let path = self.path_of(name);
        if !path.exists() {
            return Err(Error::config(
                path.display().to_string(),
                "(file)",
                format!(
                    "no pipeline file (looked for {}; pass a name from {} or a path to a .toml file)",
                    path.display(),
                    self.dir.display()
                ),
            ));
        }
        let pipeline = Pipeline::load(&path)?;
        pipeline.check_schedule(now)?;
        Ok(pipeline)
    }

    /// Loads a pipeline that is about to contact its sources: every
    /// `${ENV}` its templates read must be set.
    pub fn load_runnable(&self, name: &str, now: DateTime<Utc>) -> Result<Pipeline, Error> {
        let pipeline = self.load(name, now)?;
        pipeline.check_env()?;
        Ok(pipeline)
    }

    /// The pipeline files (`*.toml`) of the folder, sorted.
    pub fn files(&self) -> Result<Vec<PathBuf>, Error> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| {
            Error::config(
                self.dir.display().to_string(),
                "pipelines folder",
                format!("cannot list pipelines: {e}"),
            )
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        paths.sort();
        Ok(paths)
    }
}

/// The ids of a pipeline's sources, or just `only` (an error naming the
/// sources there are when the pipeline has no such source).
pub fn source_ids(pipeline: &Pipeline, only: Option<&str>) -> Result<Vec<String>, Error> {
    match only {
        None => Ok(pipeline
            .spec
            .sources
            .iter()
            .map(|s| s.id().to_string())
            .collect()),
        Some(id) if pipeline.source(id).is_some() => Ok(vec![id.to_string()]),
        Some(id) => Err(Error::config(
            pipeline.file_name(),
            "source",
            format!(
                "no source with id {id:?} (sources: {})",
                source_ids(pipeline, None)?.join(", ")
            ),
        )),
    }
}
