//! The representation Φ that AFLite filters against: MiniLM sentence embeddings (cached by the
//! SHA-256 of the texts, so re-runs skip the encoder) or vectors the user supplies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use super::data::{LabelledDataset, Text};
use afkit_engine::embed::{SentenceEncoder, VectorStore};
use afkit_engine::output::Output;
use afkit_store::vector_cache::VectorCache;

/// A dense row-major f32 matrix, one row per example.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    pub(crate) fn new(rows: usize, cols: usize, data: Vec<f32>) -> Matrix {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        Matrix { rows, cols, data }
    }

    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// The rows at `indices`, in that order.
    pub(crate) fn select(&self, indices: &[usize]) -> Matrix {
        let mut data = Vec::with_capacity(indices.len() * self.cols);
        for &i in indices {
            data.extend_from_slice(self.row(i));
        }
        Matrix::new(indices.len(), self.cols, data)
    }

    fn from_tensor(t: &Tensor, what: &Path) -> Result<Matrix> {
        let (rows, cols) = t.dims2().with_context(|| {
            format!(
                "{}: expected a 2-D matrix (one row per example), found shape {:?}",
                what.display(),
                t.dims()
            )
        })?;
        let data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        if let Some(bad) = data.iter().position(|v| !v.is_finite()) {
            bail!(
                "{}: row {} has a non-finite value",
                what.display(),
                bad / cols.max(1)
            );
        }
        Ok(Matrix::new(rows, cols, data))
    }

    /// Writes the matrix as a float32 `.npy` file (format 1.0, C order). Written here rather
    /// than by candle's `Tensor::write_npy`, which makes one system call per value: 7 s for
    /// 20k × 384.
    pub(crate) fn write_npy(&self, path: &Path, output: &Output) -> Result<()> {
        use std::io::Write;
        let mut staged = output.stage(path)?;
        let mut write = || -> std::io::Result<()> {
            let mut out = std::io::BufWriter::new(staged.file());
            let mut header = format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
                self.rows, self.cols
            );
            // Magic (6 bytes), version (2), header length (2), header: padded with spaces to a
            // multiple of 64 bytes and ended by a newline, as NumPy writes it.
            let used = 10 + header.len() + 1;
            header.extend(std::iter::repeat_n(' ', used.next_multiple_of(64) - used));
            header.push('\n');
            out.write_all(b"\x93NUMPY\x01\x00")?;
            out.write_all(&(header.len() as u16).to_le_bytes())?;
            out.write_all(header.as_bytes())?;
            for v in &self.data {
                out.write_all(&v.to_le_bytes())?;
            }
            out.flush()
        };
        write().with_context(|| format!("cannot write {}", path.display()))?;
        output.commit(vec![staged])
    }
}

/// Reads user-supplied vectors: a float `.npy` matrix, or a `.safetensors` file holding exactly
/// one 2-D tensor. Checks there is one row per example.
pub fn load_vectors(path: &Path, expected_rows: usize) -> Result<Matrix> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let tensor = match ext.as_deref() {
        Some("npy") => {
            check_npy_sizes(path)?;
            Tensor::read_npy(path)
                .with_context(|| format!("{}: not a readable .npy array", path.display()))?
        }
        Some("safetensors") => {
            let tensors = candle_core::safetensors::load(path, &Device::Cpu)
                .with_context(|| format!("{}: not a readable safetensors file", path.display()))?;
            let mut matrices: Vec<(String, Tensor)> =
                tensors.into_iter().filter(|(_, t)| t.rank() == 2).collect();
            if matrices.len() != 1 {
                bail!(
                    "{}: expected exactly one 2-D tensor, found {}",
                    path.display(),
                    matrices.len()
                );
            }
            matrices.pop().expect("one matrix").1
        }
        _ => bail!(
            "{}: expected a .npy or .safetensors file of feature vectors",
            path.display()
        ),
    };
    if !matches!(
        tensor.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        bail!(
            "{}: expected float vectors, found {:?}",
            path.display(),
            tensor.dtype()
        );
    }
    let matrix = Matrix::from_tensor(&tensor, path)?;
    if matrix.rows != expected_rows {
        bail!(
            "{}: has {} rows but the input has {} examples (one row per example, in input order)",
            path.display(),
            matrix.rows,
            expected_rows
        );
    }
    Ok(matrix)
}

/// Checks that an `.npy` file holds the header and the values its header declares, before
/// candle's reader allocates buffers of the declared sizes: a 100-byte file whose header claimed
/// 4 GB made `aflite --features` allocate 4 GB (found by the `npy_features` fuzz target).
fn check_npy_sizes(path: &Path) -> Result<()> {
    use std::io::{Read, Seek};
    let what = path.display();
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {what}"))?;
    let file_len = file.metadata()?.len();
    let mut prefix = Vec::with_capacity(12);
    file.by_ref().take(12).read_to_end(&mut prefix)?;
    if prefix.len() < 10 || &prefix[..6] != b"\x93NUMPY" {
        bail!("{what}: not an .npy file (it does not start with \\x93NUMPY)");
    }
    let (header_start, header_len) = match prefix[6] {
        1 => (10, u16::from_le_bytes([prefix[8], prefix[9]]) as u64),
        2 if prefix.len() == 12 => (
            12,
            u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as u64,
        ),
        version => bail!("{what}: unsupported .npy format version {version} (1 or 2 expected)"),
    };
    let data_start = header_start + header_len;
    if data_start > file_len {
        bail!(
            "{what}: the header declares {header_len} bytes but the file has only {}",
            file_len - header_start.min(file_len)
        );
    }
    let mut header = vec![0u8; header_len as usize];
    file.seek(std::io::SeekFrom::Start(header_start))?;
    file.read_exact(&mut header)?;
    let header = String::from_utf8_lossy(&header);
    let values = declared_values(&header)
        .with_context(|| format!("{what}: no readable 'shape' in the .npy header"))?;
    // Every element type takes at least one byte.
    let data_bytes = file_len - data_start;
    if values > data_bytes {
        bail!("{what}: the header declares {values} values but only {data_bytes} bytes follow it");
    }
    Ok(())
}

/// The number of values the `shape` tuple of an `.npy` header declares (`None` if it cannot be
/// read or overflows).
fn declared_values(header: &str) -> Option<u64> {
    let rest = &header[header.find("shape")?..];
    let open = rest.find('(')?;
    let close = open + rest[open..].find(')')?;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .try_fold(1u64, |n, d| n.checked_mul(d.parse().ok()?))
}

/// How MiniLM features were obtained.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct EmbeddingReport {
    pub texts: usize,
    pub unique_texts: usize,
    /// The folder of the embedding cache read and written, if any.
    pub cache_dir: Option<PathBuf>,
    /// Distinct texts whose vectors came from the cache.
    pub cached_texts: usize,
    pub seconds: f64,
}

/// MiniLM features: a text's embedding u, or for a pair [u; v; |u−v|; u⊙v].
/// `cache_dir` (if given) holds the embedding cache, keyed text by text, so that a dataset that
/// changed since the last run embeds only its new texts.
pub(crate) fn minilm(
    dataset: &LabelledDataset,
    cache_dir: Option<&Path>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Matrix, EmbeddingReport)> {
    let started = std::time::Instant::now();
    let texts: Vec<&str> = dataset
        .examples
        .iter()
        .flat_map(|e| match &e.text {
            Text::Single(t) => vec![t.as_str()],
            Text::Pair(a, b) => vec![a.as_str(), b.as_str()],
        })
        .collect();
    // Embed each distinct text once (NLI premises repeat several times).
    let (unique, positions) = distinct(&texts);

    let encoder = SentenceEncoder::load_default()?;
    let mut cache = cache_dir.map(VectorCache::open_in).transpose()?;
    let mut cached_texts = None;
    let mut done = 0;
    progress(done, unique.len());
    let vectors = encoder.encode_cached(
        &unique,
        cache.as_mut().map(|c| c as &mut dyn VectorStore),
        |n| {
            // The first report is the texts the cache held.
            cached_texts.get_or_insert(n);
            done += n;
            progress(done, unique.len())
        },
    )?;
    let dim = encoder.dim();
    let unique_vectors = Matrix::new(unique.len(), dim, vectors.into_iter().flatten().collect());

    let matrix = if dataset.is_pairs() {
        pair_features(&unique_vectors, &positions, dataset.len())
    } else {
        unique_vectors.select(&positions)
    };
    let report = EmbeddingReport {
        texts: texts.len(),
        unique_texts: unique.len(),
        cache_dir: cache_dir.map(Path::to_path_buf),
        cached_texts: cached_texts.unwrap_or(0),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((matrix, report))
}

/// The distinct texts in order of first appearance, and where each text is among them.
fn distinct<'a>(texts: &[&'a str]) -> (Vec<&'a str>, Vec<usize>) {
    let mut unique: Vec<&str> = Vec::new();
    let mut slot: HashMap<&str, usize> = HashMap::new();
    let positions: Vec<usize> = texts
        .iter()
        .map(|t| {
            *slot.entry(*t).or_insert_with(|| {
                unique.push(*t);
                unique.len() - 1
            })
        })
        .collect();
    (unique, positions)
}

/// A row [u; v; |u−v|; u⊙v] for each of the `n` pairs of texts, `positions` naming each pair's
/// two rows of `vectors` one after the other.
fn pair_features(vectors: &Matrix, positions: &[usize], n: usize) -> Matrix {
    let dim = vectors.cols;
    let mut data = Vec::with_capacity(n * 4 * dim);
    for pair in positions.chunks_exact(2) {
        let (u, v) = (vectors.row(pair[0]), vectors.row(pair[1]));
        data.extend_from_slice(u);
        data.extend_from_slice(v);
        data.extend(u.iter().zip(v).map(|(a, b)| (a - b).abs()));
        data.extend(u.iter().zip(v).map(|(a, b)| a * b));
    }
    Matrix::new(n, 4 * dim, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `npy_features` fuzz target: a version-2 header whose length field claims
    /// ~4 GB, in a 100-byte file.
    const HUGE_HEADER_NPY: &[u8] = b"\x93NUMPY\x02\x09\x00\x7d\x7d\xff\xff\xff\xff\xff";

    #[test]
    fn npy_sizes_are_checked_against_the_file_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.npy");
        let message = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            format!("{:#}", load_vectors(&path, 1).unwrap_err())
        };
        let huge_header = message(HUGE_HEADER_NPY);
        assert!(
            huge_header.contains("f.npy: the header declares"),
            "{huge_header}"
        );
        let header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999, 2), }\n";
        let mut huge_shape = b"\x93NUMPY\x01\x00".to_vec();
        huge_shape.extend((header.len() as u16).to_le_bytes());
        huge_shape.extend(header);
        huge_shape.extend([0u8; 16]);
        let huge_shape = message(&huge_shape);
        assert!(
            huge_shape.contains("declares 19999999998 values"),
            "{huge_shape}"
        );
        Matrix::new(2, 2, vec![1.0, 2.0, 3.0, 4.0])
            .write_npy(&path, &Output::new(true))
            .unwrap();
        let good = std::fs::read(&path).unwrap();
        let truncated = message(&good[..good.len() - 1]);
        assert!(truncated.contains("f.npy"), "{truncated}");
    }

    #[test]
    fn npy_and_safetensors_round_trip_with_row_check() {
        let dir = tempfile::tempdir().unwrap();
        let m = Matrix::new(3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let npy = dir.path().join("f.npy");
        m.write_npy(&npy, &Output::default()).unwrap();
        assert_eq!(load_vectors(&npy, 3).unwrap(), m);
        let err = format!("{:#}", load_vectors(&npy, 4).unwrap_err());
        assert!(
            err.contains("3 rows") && err.contains("4 examples"),
            "{err}"
        );

        let st = dir.path().join("f.safetensors");
        let tensor = Tensor::from_slice(&m.data, (m.rows, m.cols), &Device::Cpu).unwrap();
        let tensors = HashMap::from([("embeddings".to_string(), tensor)]);
        candle_core::safetensors::save(&tensors, &st).unwrap();
        assert_eq!(load_vectors(&st, 3).unwrap(), m);
    }
}
