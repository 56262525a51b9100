/** What the JobLogStore conformance cases share: the stores they open, and how entries are written. */
import type { it } from "vitest";
import type { JobLogStore, LogEntry } from "../runner/ports.js";
import { logEntry } from "./helpers.js";

/** The suite's store openers, handed to each group of cases. */
export interface LogStoreCases<S extends JobLogStore = JobLogStore> {
  /** A new store (closed after the case). */
  fresh(): Promise<S>;
  /** A second store on the same backing as `store` (a restart, another replica). */
  again(store: S): Promise<JobLogStore>;
  /** `it` when the adapter can reopen its backing, else a skip. */
  withReopen: typeof it;
  /** Whether `again` works (the adapter can reopen its backing). */
  canReopen: boolean;
}

/** One entry a text, on stdout (or stderr). */
export const lines = (texts: string[], stderr = false): LogEntry[] => texts.map((t) => logEntry(t, stderr));
