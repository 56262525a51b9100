/**
 * Loads `node:sqlite` (built into Node ≥ 22.13) the first time an fs store opens its record
 * database, not when the package is imported: a program that never opens an fs store (a
 * runner, a depot on PostgreSQL) never loads it.
 * Why: docs/decisions/depot-publish-durability.md, "sqlite.ts: loading node:sqlite without its warning".
 */
import type * as Sqlite from "node:sqlite";

let loaded: typeof Sqlite | undefined;

/** The `node:sqlite` module, loaded once without its ExperimentalWarning. O(1) after the first call. */
export function loadSqlite(): typeof Sqlite {
  if (loaded) return loaded;
  const emitWarning = process.emitWarning;
  process.emitWarning = function filtered(this: NodeJS.Process, warning: string | Error, ...rest: unknown[]) {
    const type = typeof rest[0] === "string" ? rest[0] : (rest[0] as { type?: string } | undefined)?.type;
    const text = typeof warning === "string" ? warning : warning.message;
    const name = typeof warning === "string" ? type : warning.name;
    if (name === "ExperimentalWarning" && /SQLite/i.test(text)) return;
    return (emitWarning as (...args: unknown[]) => void).call(process, warning, ...rest);
  } as typeof process.emitWarning;
  try {
    loaded = process.getBuiltinModule("node:sqlite") as typeof Sqlite;
  } finally {
    process.emitWarning = emitWarning;
  }
  return loaded;
}
