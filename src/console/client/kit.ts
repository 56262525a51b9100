/**
 * Types shared by the console's browser functions (app.ts and the pages it hands a kit to). Types only: nothing
 * here is shipped, so the functions stay self-contained.
 */
// Types only: erased from the function text script.ts ships.
import type { JobSummary as RunnerJobSummary } from "../../runner/service/job-list.js";

/** A job as the console's API sends it: the runner's summary, plus whether it can be cancelled. */
export type JobSummary = RunnerJobSummary & {
  cancellable?: boolean;
  /** The versions the job published with its own credentials (issue 26). */
  published?: Array<{ name: string; version: string }>;
};

/** What a page takes from app.ts: its DOM builder, API client and time format. */
export interface PageKit {
  h<K extends keyof HTMLElementTagNameMap>(
    tag: K,
    attrs?: Record<string, string | boolean | undefined>,
    ...children: Array<Node | string | null | undefined | false>
  ): HTMLElementTagNameMap[K];
  api<T>(path: string, init?: RequestInit): Promise<T>;
  /** The console's base path. */
  base: string;
  /** The page's main element, which the page fills. */
  main: HTMLElement;
  fmtTime(iso: string | null | undefined): string;
}

/** What the home page takes besides: the job list's formats and badges. */
export interface HomeKit extends PageKit {
  fmtDuration(ms: number | null): string;
  errorBox(error: unknown): HTMLElement;
  stateBadge(job: JobSummary): HTMLElement;
  outcomeLabel(job: JobSummary): string;
}
