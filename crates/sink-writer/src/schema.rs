//! Start-up check of each configured table against its mapping, and the SQL the sink runs for it.
//!
//! A table that does not fit refuses the start with an error naming the table and the missing
//! column or constraint: better than a batch that fails forever at 3 a.m.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sqlx::PgPool;

use crate::column_type::{self, ColumnType};
use crate::error::SinkError;
use crate::mapping::{BoundColumn, RowShape};
use crate::targets::{Source, TargetKind, TargetSpec};

/// A target checked against the database, with its statements.
#[derive(Debug, Clone)]
pub struct PreparedTarget {
    pub spec: TargetSpec,
    pub shape: RowShape,
    /// Index of the bound column holding the fingerprint, when one is mapped.
    pub fingerprint_index: Option<usize>,
    /// Which candidates' keys are stored already (`$1`: the keys as text; returns the 1-based
    /// positions of the stored ones). Splits a batch into fresh keys, which go in by `COPY`, and
    /// stored ones, which need `write_sql`'s comparison (and, versioned, its upsert).
    pub probe_sql: String,
    /// `write_sql`'s reading half alone (no `send` array, no insert): for the candidates of an
    /// append target whose key the probe found stored, since `ON CONFLICT DO NOTHING` would
    /// write none of them.
    pub read_stored_sql: String,
    /// `COPY table (bound columns, now columns) FROM STDIN` (text format): the rows of keys the
    /// probe found nothing under. See `table_writer` for why this is safe.
    pub copy_sql: String,
    /// How many `now` columns follow the bound ones in `copy_sql`.
    pub now_columns: usize,
    /// One statement: reads the rows stored under the candidates' keys (before the write) and
    /// writes the winners — append: `INSERT … ON CONFLICT (key) DO NOTHING`, versioned: the upsert
    /// guarded by `WHERE stored.version < incoming.version`. The candidates travel as text arrays
    /// through `UNNEST`.
    pub write_sql: String,
    /// Only for a winner another writer got in before (a race between sinks): the row stored now,
    /// whether its content differs, whether the version is the same, and its fingerprint.
    pub compare_sql: String,
    /// `DELETE` of one chunk of rows older than the retention (when configured).
    pub purge_sql: Option<String>,
    /// Append targets: whether the last `COPY` tried without a probe was refused (stored keys:
    /// a replay). While set, `table_writer` probes first. Only a cost choice, never a result.
    pub replaying: Arc<AtomicBool>,
}

impl PreparedTarget {
    pub fn name(&self) -> &str {
        &self.spec.table
    }
}

/// `"name"`, with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A possibly schema-qualified table name, quoted part by part.
pub fn quote_table(table: &str) -> String {
    match table.split_once('.') {
        Some((schema, name)) => format!("{}.{}", quote_ident(schema), quote_ident(name)),
        None => quote_ident(table),
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CatalogColumn {
    pub(crate) name: String,
    pub(crate) typname: String,
    pub(crate) sql_type: String,
    pub(crate) typmod: i32,
    pub(crate) not_null: bool,
    pub(crate) has_default: bool,
    pub(crate) identity: bool,
    pub(crate) generated: bool,
}

pub(crate) async fn catalog_columns(
    pool: &PgPool,
    quoted_table: &str,
) -> Result<Option<Vec<CatalogColumn>>, SinkError> {
    let exists = sqlx::query_scalar!(
        r#"SELECT to_regclass($1) IS NOT NULL AS "exists!""#,
        quoted_table,
    )
    .fetch_one(pool)
    .await
    .map_err(SinkError::from_db)?;
    if !exists {
        return Ok(None);
    }
    let rows = sqlx::query!(
        r#"SELECT a.attname::text AS "name!", t.typname::text AS "typname!",
                format_type(a.atttypid, a.atttypmod) AS "sql_type!",
                a.atttypmod AS "typmod!", a.attnotnull AS "not_null!",
                a.atthasdef AS "has_default!", a.attidentity::text AS "identity!",
                a.attgenerated::text AS "generated!"
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum"#,
        quoted_table,
    )
    .fetch_all(pool)
    .await
    .map_err(SinkError::from_db)?;
    Ok(Some(
        rows.into_iter()
            .map(|row| CatalogColumn {
                name: row.name,
                typname: row.typname,
                sql_type: row.sql_type,
                typmod: row.typmod,
                not_null: row.not_null,
                has_default: row.has_default,
                identity: !row.identity.is_empty(),
                generated: !row.generated.is_empty(),
            })
            .collect(),
    ))
}

/// Whether a unique, non-partial index on exactly `column` exists: what `ON CONFLICT (column)`
/// needs to infer its arbiter.
pub(crate) async fn has_unique_index(
    pool: &PgPool,
    quoted_table: &str,
    column: &str,
) -> Result<bool, SinkError> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (
             SELECT 1 FROM pg_index i
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
             WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1
               AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2) AS "exists!""#,
        quoted_table,
        column,
    )
    .fetch_one(pool)
    .await
    .map_err(SinkError::from_db)
}

fn schema_error(spec: &TargetSpec, message: impl std::fmt::Display) -> SinkError {
    SinkError::Schema(format!("table {}: {message}", spec.table))
}

/// The mapping's columns bound to the table's: each exists, is writable and has a type the sink
/// writes (`now` columns apart: a timestamp, filled by the statement); and every NOT NULL column
/// without a default has a source.
fn bind_columns(
    spec: &TargetSpec,
    catalog: &[CatalogColumn],
) -> Result<(Vec<BoundColumn>, Vec<String>), SinkError> {
    let find = |name: &str| catalog.iter().find(|c| c.name == name);
    let mut columns = Vec::new();
    let mut now_columns = Vec::new();
    for (name, source) in &spec.columns {
        let Some(column) = find(name) else {
            return Err(schema_error(spec, format!("has no column {name:?}")));
        };
        if column.generated {
            return Err(schema_error(
                spec,
                format!("column {name:?} is generated and cannot be written"),
            ));
        }
        if *source == Source::Now {
            let ty = ColumnType::from_catalog(&column.typname, &column.sql_type, column.typmod);
            if !ty.as_ref().is_some_and(ColumnType::is_timestamp) {
                return Err(schema_error(
                    spec,
                    format!(
                        "column {name:?} is {}, but `now` needs a timestamp column",
                        column.sql_type
                    ),
                ));
            }
            now_columns.push(name.clone());
            continue;
        }
        let Some(ty) = ColumnType::from_catalog(&column.typname, &column.sql_type, column.typmod)
        else {
            return Err(schema_error(
                spec,
                format!(
                    "column {name:?} has type {}, which the sink cannot write (supported: {})",
                    column.sql_type,
                    column_type::SUPPORTED
                ),
            ));
        };
        columns.push(BoundColumn {
            name: name.clone(),
            source: source.clone(),
            ty,
            required: column.not_null && !column.has_default,
        });
    }

    let unmapped_required: Vec<&str> = catalog
        .iter()
        .filter(|c| c.not_null && !c.has_default && !c.identity && !c.generated)
        .filter(|c| spec.source_of(&c.name).is_none())
        .map(|c| c.name.as_str())
        .collect();
    if !unmapped_required.is_empty() {
        return Err(schema_error(
            spec,
            format!(
                "columns {unmapped_required:?} are NOT NULL without a default but have no source \
                 in the mapping"
            ),
        ));
    }

    Ok((columns, now_columns))
}

/// The version column's index among the bound columns: bound, and an integer.
fn version_index(spec: &TargetSpec, columns: &[BoundColumn]) -> Result<Option<usize>, SinkError> {
    let index_of = |name: &str| columns.iter().position(|c| c.name == name);
    Ok(match &spec.version_column {
        None => None,
        Some(version) => {
            let i = index_of(version).ok_or_else(|| {
                schema_error(
                    spec,
                    format!("the version column {version:?} must be bound"),
                )
            })?;
            if !columns[i].ty.is_integer() {
                return Err(schema_error(
                    spec,
                    format!(
                        "the version column {version:?} is {}, but must be an integer column",
                        columns[i].ty.sql_name
                    ),
                ));
            }
            Some(i)
        }
    })
}

/// The retention column exists and is a timestamp.
fn check_retention_column(spec: &TargetSpec, catalog: &[CatalogColumn]) -> Result<(), SinkError> {
    let find = |name: &str| catalog.iter().find(|c| c.name == name);
    if let Some(retention) = &spec.retention {
        let column = find(&retention.column).ok_or_else(|| {
            schema_error(
                spec,
                format!("has no retention column {:?}", retention.column),
            )
        })?;
        if !matches!(column.typname.as_str(), "timestamptz" | "timestamp") {
            return Err(schema_error(
                spec,
                format!(
                    "the retention column {:?} is {}, but must be a timestamp",
                    retention.column, column.sql_type
                ),
            ));
        }
    }
    Ok(())
}

/// Checks one target against the database and builds its statements.
pub async fn prepare(pool: &PgPool, spec: TargetSpec) -> Result<PreparedTarget, SinkError> {
    let table = quote_table(&spec.table);
    let Some(catalog) = catalog_columns(pool, &table).await? else {
        return Err(schema_error(
            &spec,
            "does not exist; create it before starting the sink (only the default tables are \
             created by the migrations)",
        ));
    };
    let (columns, now_columns) = bind_columns(&spec, &catalog)?;
    let index_of = |name: &str| columns.iter().position(|c| c.name == name);
    let key_index = index_of(&spec.key).ok_or_else(|| {
        schema_error(
            &spec,
            format!("the key column {:?} must be bound", spec.key),
        )
    })?;
    if !has_unique_index(pool, &table, &spec.key).await? {
        return Err(schema_error(
            &spec,
            format!(
                "has no unique constraint (or unique index) on exactly the key column {:?}; \
                 idempotent writes need one (ALTER TABLE … ADD UNIQUE ({}))",
                spec.key, spec.key
            ),
        ));
    }
    let version_index = version_index(&spec, &columns)?;
    check_retention_column(&spec, &catalog)?;

    let fingerprint_index = columns.iter().position(|c| c.source == Source::Fingerprint);
    let content_indices = match fingerprint_index {
        Some(i) => vec![i],
        None => (0..columns.len())
            .filter(|&i| i != key_index && !columns[i].source.is_position())
            .collect(),
    };
    let shape = RowShape {
        table: spec.table.clone(),
        columns,
        key_index,
        version_index,
        content_indices,
    };
    let statements = statements(&spec, &shape, &now_columns, fingerprint_index);
    let purge_sql = spec.retention.as_ref().map(|retention| {
        let column = quote_ident(&retention.column);
        format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE {column} < now() - make_interval(secs => $1) LIMIT 10000))"
        )
    });
    Ok(PreparedTarget {
        spec,
        shape,
        fingerprint_index,
        probe_sql: statements.probe,
        read_stored_sql: statements.read_stored,
        copy_sql: statements.copy,
        now_columns: now_columns.len(),
        write_sql: statements.write,
        compare_sql: statements.compare,
        purge_sql,
        replaying: Arc::default(),
    })
}

/// `UNNEST($1::text[], …) AS u(c0, …)`: every value travels as text, cast to its column type.
fn unnest(count: usize) -> String {
    let arrays: Vec<String> = (1..=count).map(|i| format!("${i}::text[]")).collect();
    let aliases: Vec<String> = (0..count).map(|i| format!("c{i}")).collect();
    format!("UNNEST({}) AS u({})", arrays.join(", "), aliases.join(", "))
}

/// The statements of one target, built from its checked shape.
struct Statements {
    probe: String,
    read_stored: String,
    copy: String,
    write: String,
    compare: String,
}

/// What a versioned target's insert does on a stored key (the newer version wins), or an
/// append target's (nothing).
fn conflict_clause(spec: &TargetSpec, names: &[String], key: &str) -> String {
    match spec.kind {
        TargetKind::Append => format!("ON CONFLICT ({key}) DO NOTHING"),
        TargetKind::Versioned => {
            let version = quote_ident(spec.version_column.as_deref().unwrap_or("version"));
            let updates: Vec<String> = names
                .iter()
                .filter(|name| name.as_str() != key)
                .map(|name| format!("{name} = EXCLUDED.{name}"))
                .collect();
            format!(
                "ON CONFLICT ({key}) DO UPDATE SET {updates} \
                 WHERE t.{version} IS NULL OR t.{version} < EXCLUDED.{version}",
                updates = updates.join(", ")
            )
        }
    }
}

/// The SQL expressions that compare a stored row `t` with a candidate `u`.
struct Comparison {
    /// True when a content column differs: a conflict.
    differs: String,
    /// True when the version column holds the same version.
    same_version: String,
    /// The stored fingerprint, as text.
    fingerprint: String,
    /// The stored version, as bigint.
    stored_version: String,
}

fn comparison(shape: &RowShape, fingerprint_index: Option<usize>) -> Comparison {
    let columns = &shape.columns;
    let differs: Vec<String> = shape
        .content_indices
        .iter()
        .map(|&i| {
            let column = &columns[i];
            let name = quote_ident(&column.name);
            if column.ty.compare_as_jsonb {
                format!("t.{name}::jsonb IS DISTINCT FROM u.c{i}::jsonb")
            } else {
                format!("t.{name} IS DISTINCT FROM u.c{i}::{}", column.ty.sql_name)
            }
        })
        .collect();
    let differs = if differs.is_empty() {
        "false".to_owned()
    } else {
        differs.join(" OR ")
    };
    let same_version = match shape.version_index {
        Some(i) => format!(
            "t.{} IS NOT DISTINCT FROM u.c{i}::{}",
            quote_ident(&columns[i].name),
            columns[i].ty.sql_name
        ),
        None => "true".into(),
    };
    let fingerprint = match fingerprint_index {
        Some(i) => format!("t.{}::text", quote_ident(&columns[i].name)),
        None => "NULL::text".into(),
    };
    let stored_version = match shape.version_index {
        Some(i) => format!("t.{}::bigint", quote_ident(&columns[i].name)),
        None => "NULL::bigint".into(),
    };
    Comparison {
        differs,
        same_version,
        fingerprint,
        stored_version,
    }
}

fn statements(
    spec: &TargetSpec,
    shape: &RowShape,
    now_columns: &[String],
    fingerprint_index: Option<usize>,
) -> Statements {
    let table = quote_table(&spec.table);
    let key = quote_ident(&spec.key);
    let columns = &shape.columns;
    let mut names: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
    let mut select: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("u.c{i}::{}", c.ty.sql_name))
        .collect();
    for name in now_columns {
        names.push(quote_ident(name));
        select.push("now()".into());
    }
    let count = columns.len();
    let k = shape.key_index;
    let key_type = &columns[k].ty.sql_name;
    let conflict_clause = conflict_clause(spec, &names, &key);
    let Comparison {
        differs,
        same_version,
        fingerprint,
        stored_version,
    } = comparison(shape, fingerprint_index);
    // One round trip: `pre` reads what is stored under every candidate's key from the statement's
    // snapshot (before the write), `w` writes the one row per key flagged `send`. The stored row
    // travels back only when it differs (a conflict needs it), so a replay of duplicates is cheap.
    let aliases: Vec<String> = (0..count).map(|i| format!("c{i}")).collect();
    let arrays: Vec<String> = (1..=count).map(|i| format!("${i}::text[]")).collect();
    let pre = format!(
        "pre AS (SELECT u.ord, CASE WHEN ({differs}) THEN to_jsonb(t)::text END AS stored_row, \
             ({differs}) AS differs, {stored_version} AS stored_version, \
             CASE WHEN ({differs}) THEN {fingerprint} END AS fingerprint \
             FROM u JOIN {table} t ON t.{key} = u.c{k}::{key_type})"
    );
    let body = format!(
        "{pre}, \
         w AS (INSERT INTO {table} AS t ({names}) SELECT {select} FROM u WHERE u.send \
             ORDER BY u.c{k} {conflict_clause} RETURNING t.{key}::text AS written) \
         SELECT ord, stored_row, differs, stored_version, fingerprint, NULL::text FROM pre \
         UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, written FROM w",
        names = names.join(", "),
        select = select.join(", "),
    );
    // An append target writes nothing under a stored key: for those, the comparison alone.
    let read_stored = format!(
        "WITH u AS (SELECT * FROM UNNEST({arrays}) WITH ORDINALITY AS u({aliases}, ord)), \
         {pre} SELECT ord, stored_row, differs, stored_version, fingerprint, NULL::text FROM pre",
        arrays = arrays.join(", "),
        aliases = aliases.join(", "),
    );
    let write = format!(
        "WITH u AS (SELECT * FROM UNNEST({arrays}, ${send}::bool[]) WITH ORDINALITY \
             AS u({aliases}, send, ord)), {body}",
        arrays = arrays.join(", "),
        send = count + 1,
        aliases = aliases.join(", "),
    );
    // `now` columns take the text `now`, which PostgreSQL reads as the transaction's start: what
    // `now()` returns in the insert.
    let copy = format!("COPY {table} ({}) FROM STDIN", names.join(", "));
    let probe = format!(
        "SELECT u.ord FROM UNNEST($1::text[]) WITH ORDINALITY AS u(k, ord) \
         JOIN {table} t ON t.{key} = u.k::{key_type}"
    );
    let compare = format!(
        "SELECT u.c{k}, to_jsonb(t)::text, ({differs}), ({same_version}), {fingerprint} \
         FROM {source} JOIN {table} t ON t.{key} = u.c{k}::{key_type}",
        source = unnest(count),
    );
    Statements {
        probe,
        read_stored,
        copy,
        write,
        compare,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets;

    fn shape_of(spec: &TargetSpec, types: &[(&str, &str)]) -> (RowShape, Vec<String>) {
        let mut columns = Vec::new();
        let mut now = Vec::new();
        for (name, source) in &spec.columns {
            if *source == Source::Now {
                now.push(name.clone());
                continue;
            }
            let ty_name = types
                .iter()
                .find(|(c, _)| c == name)
                .map(|(_, t)| *t)
                .unwrap_or("text");
            columns.push(BoundColumn {
                name: name.clone(),
                source: source.clone(),
                ty: ColumnType::from_catalog(ty_name, ty_name, -1).expect("supported"),
                required: true,
            });
        }
        let key_index = columns
            .iter()
            .position(|c| c.name == spec.key)
            .expect("key");
        let version_index = spec
            .version_column
            .as_ref()
            .and_then(|v| columns.iter().position(|c| &c.name == v));
        let content_indices = (0..columns.len())
            .filter(|&i| i != key_index && !columns[i].source.is_position())
            .collect();
        (
            RowShape {
                table: spec.table.clone(),
                columns,
                key_index,
                version_index,
                content_indices,
            },
            now,
        )
    }

    #[test]
    fn quoting_survives_odd_names() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_table("ledger.payments"), "\"ledger\".\"payments\"");
    }

    #[test]
    fn one_statement_per_batch_with_unnest_arrays() {
        let defaults = targets::defaults();
        let (shape, now) = shape_of(&defaults[1], &[("version", "int8"), ("payload", "jsonb")]);
        let Statements {
            write,
            compare,
            copy,
            probe,
            read_stored,
        } = statements(&defaults[1], &shape, &now, None);
        assert_eq!(
            copy,
            "COPY \"entity_state\" (\"entity_id\", \"version\", \"payload\", \"event_id\", \
             \"updated_at\") FROM STDIN"
        );
        assert!(
            probe.contains("JOIN \"entity_state\" t ON t.\"entity_id\" = u.k::text"),
            "{probe}"
        );
        assert!(
            read_stored.starts_with(
                "WITH u AS (SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], \
                 $4::text[]) WITH ORDINALITY AS u(c0, c1, c2, c3, ord)), pre AS"
            ) && !read_stored.contains("INSERT"),
            "{read_stored}"
        );
        assert!(
            write.contains("INSERT INTO \"entity_state\" AS t"),
            "{write}"
        );
        assert!(
            write.contains(
                "UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[]) WITH ORDINALITY"
            ),
            "{write}"
        );
        assert!(
            write.contains("pre AS (SELECT u.ord"),
            "the stored rows are read in the same statement: {write}"
        );
        assert!(
            write.contains("WHERE t.\"version\" IS NULL OR t.\"version\" < EXCLUDED.\"version\""),
            "{write}"
        );
        assert!(write.contains("\"updated_at\" = EXCLUDED.\"updated_at\""));
        assert!(
            !write.contains("\"entity_id\" = EXCLUDED"),
            "the key is not updated"
        );
        assert!(
            compare.contains("t.\"payload\" IS DISTINCT FROM u.c2::jsonb"),
            "{compare}"
        );
        assert!(compare.contains("JOIN \"entity_state\" t ON t.\"entity_id\" = u.c0::text"));
    }
}
