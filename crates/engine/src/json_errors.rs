//! Error messages of the JSON readers (ingest's ActivityNet and JSONL files, `import-pool`'s
//! pools). Each names the place in its own terms — `file:line:column`, with a JSON Lines line
//! parsed on its own — so serde_json's position, relative to the text it was given, must go.

/// serde_json's message without the " at line L column C" it ends with; the caller gives the
/// position in the file instead.
pub fn json_error_without_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    message
        .strip_suffix(&suffix)
        .map_or(message.clone(), str::to_string)
}
