//! A provider-like target's `[targets.results]` (docs/sink-writer.md "The answer in a table"):
//! the useful part of each success (the API's charge id, its status) written to a table of
//! the user's, one row per charged event, in the transaction that checkpoints the batch. So every
//! effect is auditable on both sides: the API holds our key, the table holds its answer.
//!
//! The answer is the one dedup-service keeps with the intent, so a replay after a crash writes
//! the same row; the row is keyed by `event_id` (`ON CONFLICT DO NOTHING`), so it is written once.
//! A column is the first of its JSON pointers the answer has, else NULL: an effect that happened
//! is never refused for the shape of its answer.

use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::error::SinkError;
use crate::schema::{CatalogColumn, catalog_columns, has_unique_index, quote_ident, quote_table};
use crate::targets::ResultsSpec;

/// One charged event's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResultRow {
    pub(crate) event_id: String,
    pub(crate) operation_id: String,
    /// Per configured column, in order.
    pub(crate) values: Vec<Option<String>>,
}

/// How a value goes into its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnType {
    /// A string as it is; any other JSON value as its JSON text.
    Text,
    /// The JSON value.
    Jsonb,
}

/// A results table, checked against the database at start-up.
#[derive(Debug)]
pub(crate) struct ResultsTable {
    table: String,
    pointers: Vec<Vec<String>>,
    types: Vec<ColumnType>,
    insert_sql: String,
}

impl ResultsTable {
    /// Checks `spec.table` for `target`: it exists; `event_id` is text with a unique index (the
    /// arbiter of `ON CONFLICT`); `operation_id` and every configured column exist, each
    /// `text` or `jsonb`; any other column can be left out.
    pub(crate) async fn prepare(
        pool: &PgPool,
        target: &str,
        spec: &ResultsSpec,
    ) -> Result<Self, SinkError> {
        let problem = |message: String| {
            SinkError::Schema(format!(
                "provider target {target}: results table {}: {message}",
                spec.table
            ))
        };
        let quoted = quote_table(&spec.table);
        let catalog = catalog_columns(pool, &quoted)
            .await?
            .ok_or_else(|| problem("does not exist (create it: docs/sink-writer.md)".into()))?;
        let find = |name: &str| catalog.iter().find(|column| column.name == name);
        for own in ["event_id", "operation_id"] {
            match find(own) {
                Some(column) if column.typname == "text" => {}
                Some(column) => {
                    return Err(problem(format!("{own} is {}, not text", column.sql_type)));
                }
                None => return Err(problem(format!("has no {own} column"))),
            }
        }
        if !has_unique_index(pool, &quoted, "event_id").await? {
            return Err(problem(
                "event_id needs a unique index (its primary key), so a replay writes nothing"
                    .into(),
            ));
        }
        let mut types = Vec::with_capacity(spec.columns.len());
        for (name, _) in &spec.columns {
            let column = find(name).ok_or_else(|| problem(format!("has no column {name}")))?;
            types.push(match column.typname.as_str() {
                "text" => ColumnType::Text,
                "jsonb" => ColumnType::Jsonb,
                _ => {
                    return Err(problem(format!(
                        "column {name} is {}: results go in text or jsonb columns",
                        column.sql_type
                    )));
                }
            });
        }
        let written: Vec<&str> = ["event_id", "operation_id"]
            .into_iter()
            .chain(spec.columns.iter().map(|(name, _)| name.as_str()))
            .collect();
        if let Some(column) = catalog
            .iter()
            .find(|column| must_be_written(column, &written))
        {
            return Err(problem(format!(
                "column {} is NOT NULL without a default, and the sink does not write it",
                column.name
            )));
        }
        Ok(Self {
            table: spec.table.clone(),
            pointers: spec
                .columns
                .iter()
                .map(|(_, pointers)| pointers.clone())
                .collect(),
            insert_sql: insert_sql(&quoted, &spec.columns, &types),
            types,
        })
    }

    /// The table's name, as configured.
    pub(crate) fn name(&self) -> &str {
        &self.table
    }

    /// The row of a charged event whose kept answer is `result`.
    pub(crate) fn row(&self, event_id: &str, operation_id: &str, result: &[u8]) -> ResultRow {
        let answer: Option<Value> = serde_json::from_slice(result).ok();
        let values = self
            .pointers
            .iter()
            .zip(&self.types)
            .map(|(pointers, column_type)| {
                let value = pointers
                    .iter()
                    .find_map(|pointer| answer.as_ref()?.pointer(pointer))
                    .filter(|value| !value.is_null())?;
                column_value(value, *column_type)
            })
            .collect();
        ResultRow {
            event_id: event_id.to_owned(),
            operation_id: operation_id.to_owned(),
            values,
        }
    }

    /// Writes `rows` in the batch's transaction; a row whose event is there already is left as
    /// it is. Returns how many were new.
    pub(crate) async fn write(
        &self,
        conn: &mut PgConnection,
        rows: &[ResultRow],
    ) -> Result<u64, SinkError> {
        if rows.is_empty() {
            return Ok(0);
        }
        let mut query = sqlx::query(&self.insert_sql)
            .bind(
                rows.iter()
                    .map(|row| row.event_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|row| row.operation_id.as_str())
                    .collect::<Vec<_>>(),
            );
        for column in 0..self.pointers.len() {
            query = query.bind(
                rows.iter()
                    .map(|row| row.values[column].as_deref())
                    .collect::<Vec<_>>(),
            );
        }
        let done = query
            .execute(&mut *conn)
            .await
            .map_err(SinkError::from_db)?;
        Ok(done.rows_affected())
    }
}

/// A column the insert leaves out that PostgreSQL cannot fill.
fn must_be_written(column: &CatalogColumn, written: &[&str]) -> bool {
    column.not_null
        && !column.has_default
        && !column.identity
        && !column.generated
        && !written.contains(&column.name.as_str())
}

/// `value` as its column takes it; PostgreSQL refuses a NUL in text and `\u0000` in jsonb, so
/// such a value is escaped (text) or left out (jsonb).
fn column_value(value: &Value, column_type: ColumnType) -> Option<String> {
    match (value, column_type) {
        (Value::String(text), ColumnType::Text) => Some(text.replace('\0', "\\0")),
        (other, ColumnType::Text) => Some(other.to_string()),
        (other, ColumnType::Jsonb) => {
            Some(other.to_string()).filter(|json| !json.contains("\\u0000"))
        }
    }
}

/// One statement for a batch: the rows travel as text arrays through `UNNEST`.
fn insert_sql(
    quoted_table: &str,
    columns: &[(String, Vec<String>)],
    types: &[ColumnType],
) -> String {
    let names: Vec<String> = ["event_id", "operation_id"]
        .into_iter()
        .map(quote_ident)
        .chain(columns.iter().map(|(name, _)| quote_ident(name)))
        .collect();
    let count = names.len();
    let arrays: Vec<String> = (1..=count).map(|n| format!("${n}::text[]")).collect();
    let aliases: Vec<String> = (0..count).map(|n| format!("c{n}")).collect();
    let selected: Vec<String> = aliases
        .iter()
        .enumerate()
        .map(
            |(n, alias)| match n.checked_sub(2).map(|column| types[column]) {
                Some(ColumnType::Jsonb) => format!("u.{alias}::jsonb"),
                _ => format!("u.{alias}"),
            },
        )
        .collect();
    format!(
        "INSERT INTO {quoted_table} ({}) SELECT {} FROM UNNEST({}) AS u({}) \
         ON CONFLICT (event_id) DO NOTHING",
        names.join(", "),
        selected.join(", "),
        arrays.join(", "),
        aliases.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ResultsTable {
        let columns = vec![
            (
                "charge_id".to_owned(),
                vec!["/id".to_owned(), "/entry/id".to_owned()],
            ),
            ("amount".to_owned(), vec!["/amount".to_owned()]),
            ("answer".to_owned(), vec!["/entry".to_owned()]),
        ];
        let types = vec![ColumnType::Text, ColumnType::Text, ColumnType::Jsonb];
        ResultsTable {
            table: "partner_charges".into(),
            insert_sql: insert_sql("\"partner_charges\"", &columns, &types),
            pointers: columns.into_iter().map(|(_, pointers)| pointers).collect(),
            types,
        }
    }

    #[test]
    fn each_column_is_the_first_pointer_the_answer_has_else_null() {
        let table = table();
        let direct = table.row("e-1", "partner:e-1", br#"{"id":"ch_1","amount":250}"#);
        assert_eq!(
            direct.values,
            [Some("ch_1".into()), Some("250".into()), None]
        );
        // A look-up's answer of another shape: the second pointer finds the id.
        let looked_up = table.row(
            "e-2",
            "partner:e-2",
            br#"{"status":"posted","entry":{"id":"ch_2","amount":null}}"#,
        );
        assert_eq!(
            looked_up.values,
            [
                Some("ch_2".into()),
                None,
                Some(r#"{"amount":null,"id":"ch_2"}"#.into())
            ]
        );
        let not_json = table.row("e-3", "partner:e-3", b"OK");
        assert_eq!(not_json.values, [None, None, None]);
        let nul = table.row(
            "e-4",
            "partner:e-4",
            br#"{"id":"a\u0000b","entry":"\u0000"}"#,
        );
        assert_eq!(nul.values, [Some("a\\0b".into()), None, None]);
    }

    #[test]
    fn one_insert_per_batch_that_leaves_a_replayed_event_alone() {
        assert_eq!(
            table().insert_sql,
            "INSERT INTO \"partner_charges\" (\"event_id\", \"operation_id\", \"charge_id\", \
             \"amount\", \"answer\") SELECT u.c0, u.c1, u.c2, u.c3, u.c4::jsonb FROM \
             UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(c0, c1, \
             c2, c3, c4) ON CONFLICT (event_id) DO NOTHING"
        );
    }
}
