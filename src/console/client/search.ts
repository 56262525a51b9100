/**
 * The log viewer's search box: the server searches the job's log a page at a time (GET api/jobs/:id/search,
 * docs/decisions/log-search.md); the box keeps the matches found so far (positions and ranges, not lines), jumps to
 * each with the viewer's own `goToLine` (which loads only the window around it) and marks the matched text in the
 * rows on screen. Like app.ts it is one self-contained function whose source text script.ts ships: nothing from
 * outside its body but its arguments and the browser's globals.
 */
import type { AnsiRun } from "./ansi.js";

/** What the search box needs from the job viewer. */
export interface SearchHost {
  /** The job's ID. */
  id: string;
  /** A console API call (path under api/, JSON answer; throws on a problem). */
  api<T>(path: string): Promise<T>;
  /** Scrolls the viewer to line `number` (1-based), fetching only the lines around it, and marks it. */
  goToLine(number: number): void;
  /** Draws the rows on screen again. */
  redraw(): void;
  /** The viewer's line renderer, to mark matched text as it is shown. */
  parseAnsi(line: string): AnsiRun[];
}

/** The search box: its element, and the hook the viewer calls for each row it draws. */
export interface SearchBox {
  element: HTMLElement;
  /** Marks the matches of line `n` (0-based) in its rendered text `body`; `text` is the stored line. */
  decorate(n: number, body: HTMLElement, text: string): void;
}

/** Builds the search box of one job's viewer. */
export function createLogSearch(host: SearchHost): SearchBox {
  /** Matches kept at most (positions and ranges): a search that finds more stops asking for them. */
  const MAX_KEPT = 50_000;
  /** Matches asked for per request. */
  const PAGE = 200;

  interface Found {
    position: number;
    ranges: Array<[number, number]>;
  }
  interface Page {
    matches: Array<Found & { line: string }>;
    next: number;
    end: boolean;
    storedLines: number;
  }

  const el = <K extends keyof HTMLElementTagNameMap>(tag: K, props: Record<string, string> = {}, text = "") => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) node.setAttribute(k, v);
    if (text) node.textContent = text;
    return node;
  };
  const form = el("form", { class: "log-search", role: "search", id: "log-search" });
  const input = el("input", {
    type: "search",
    id: "search-q",
    "aria-label": "Search the log",
    placeholder: "Search the log",
  });
  input.maxLength = 1024;
  const regex = el("input", { type: "checkbox", id: "search-regex" });
  const matchCase = el("input", { type: "checkbox", id: "search-case" });
  const prev = el("button", { type: "button", id: "search-prev", "aria-label": "Previous match" }, "↑");
  const next = el("button", { type: "submit", id: "search-next", "aria-label": "Next match" }, "↓");
  const status = el("span", { class: "search-status", id: "search-status", role: "status", "aria-live": "polite" });
  form.append(
    input,
    next,
    prev,
    el("span", {}, ""),
    regex,
    el("label", { for: "search-regex" }, " Regex"),
    matchCase,
    el("label", { for: "search-case" }, " Match case"),
    status,
  );

  /** The search under way: its query, the matches found so far and where the server scan stands. */
  let query = "";
  let found: Found[] = [];
  let byLine = new Map<number, Found>();
  let scanFrom = 0;
  let scanEnd = false;
  let current = -1;
  let generation = 0;
  let busy: Promise<void> | null = null;

  function key(): string {
    return JSON.stringify([input.value, regex.checked, matchCase.checked]);
  }

  function say(text: string): void {
    status.textContent = text;
    form.dataset.found = String(found.length);
    form.dataset.current = current >= 0 ? String(found[current]!.position + 1) : "";
    form.dataset.end = String(scanEnd);
  }

  function counted(): string {
    return scanEnd ? String(found.length) : `${found.length}+`;
  }

  /** One request at a time: the count running behind and a jump share it. */
  let inflight: Promise<boolean> | null = null;
  function more(): Promise<boolean> {
    if (inflight) return inflight;
    const p: Promise<boolean> = fetchMore().finally(() => {
      if (inflight === p) inflight = null;
    });
    return (inflight = p);
  }

  /** Asks the server for the next page of matches; true when it found any. */
  async function fetchMore(): Promise<boolean> {
    const mine = generation;
    const params = new URLSearchParams({
      q: input.value,
      regex: regex.checked ? "1" : "0",
      case: matchCase.checked ? "1" : "0",
      from: String(scanFrom),
      limit: String(PAGE),
    });
    const page = await host.api<Page>(`/jobs/${host.id}/search?${params}`);
    if (mine !== generation) return false;
    for (const m of page.matches) {
      if (found.length >= MAX_KEPT) break;
      const hit = { position: m.position, ranges: m.ranges };
      found.push(hit);
      byLine.set(m.position, hit);
    }
    scanFrom = page.next;
    scanEnd = page.end || found.length >= MAX_KEPT;
    return page.matches.length > 0;
  }

  /** Scans on until a match past the current one is known or the log's end is reached. */
  async function ensureAfter(index: number): Promise<void> {
    while (index >= found.length && !scanEnd) {
      say(`Searching… line ${scanFrom} (${counted()} found)`);
      await more();
    }
  }

  /** Counts the rest behind the first jump, a bounded request at a time, so the box can say "of N". */
  async function countRest(): Promise<void> {
    const mine = generation;
    while (!scanEnd && mine === generation) {
      await more();
      if (mine === generation && current >= 0)
        say(`Match ${current + 1} of ${counted()} (line ${found[current]!.position + 1})`);
    }
  }

  function show(): void {
    if (current < 0) {
      say(scanEnd ? "No match" : `Searching…`);
      host.redraw();
      return;
    }
    const hit = found[current]!;
    host.goToLine(hit.position + 1);
    say(`Match ${current + 1} of ${counted()} (line ${hit.position + 1})`);
  }

  async function step(forward: boolean): Promise<void> {
    if (input.value === "") {
      reset();
      say("");
      host.redraw();
      return;
    }
    if (key() !== query) {
      reset();
      query = key();
      await ensureAfter(0);
      current = found.length > 0 ? 0 : -1;
      show();
      void countRest().catch((error: unknown) => say(error instanceof Error ? error.message : String(error)));
      return;
    }
    if (forward) {
      await ensureAfter(current + 1);
      // A live job may have stored more since the scan reached its end: look once more before wrapping.
      if (current + 1 >= found.length && scanEnd && found.length < MAX_KEPT) {
        scanEnd = false;
        await more();
        scanEnd = true;
      }
      current = current + 1 < found.length ? current + 1 : found.length > 0 ? 0 : -1;
    } else {
      if (current <= 0 && !scanEnd) await ensureAfter(Number.MAX_SAFE_INTEGER);
      current = current > 0 ? current - 1 : found.length - 1;
    }
    show();
  }

  function reset(): void {
    generation++;
    query = "";
    found = [];
    byLine = new Map();
    scanFrom = 0;
    scanEnd = false;
    current = -1;
    inflight = null;
  }

  function run(forward: boolean): void {
    if (busy) return;
    busy = step(forward)
      .catch((error: unknown) => {
        say(error instanceof Error ? error.message : String(error));
      })
      .finally(() => {
        busy = null;
      });
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run(true);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.shiftKey) {
      event.preventDefault();
      run(false);
    }
  });
  prev.addEventListener("click", () => run(false));
  for (const box of [regex, matchCase]) box.addEventListener("change", () => input.value && run(true));

  /** Wraps `[start, end)` of `body`'s shown text (outside visually hidden notes) in a mark. */
  function mark(body: HTMLElement, start: number, end: number, current: boolean): void {
    const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
    const texts: Text[] = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode())
      if (!node.parentElement?.closest(".visually-hidden")) texts.push(node as Text);
    let at = 0;
    for (const node of texts) {
      const from = at;
      at += node.data.length;
      if (at <= start || from >= end) continue;
      const a = Math.max(start, from) - from;
      const b = Math.min(end, at) - from;
      const middle = node.splitText(a);
      middle.splitText(b - a);
      const hit = document.createElement("mark");
      hit.className = current ? "hit current" : "hit";
      middle.replaceWith(hit);
      hit.append(middle);
    }
  }

  function decorate(n: number, body: HTMLElement, text: string): void {
    const hit = byLine.get(n);
    if (!hit) return;
    const isCurrent = current >= 0 && found[current] === hit;
    // Ranges count in the stored text; the row shows it as a terminal would (escapes gone, \r overwriting), so
    // the matched text is marked where it shows.
    const shown = Array.prototype.map
      .call(body.childNodes, (node: Node) =>
        (node as Element).classList?.contains("visually-hidden") ? "" : (node.textContent ?? ""),
      )
      .join("");
    const spans: Array<[number, number]> = [];
    for (const [s, e] of hit.ranges) {
      const piece = host
        .parseAnsi(text.slice(s, e))
        .map((r) => r.text)
        .join("");
      if (piece === "") continue;
      for (let at = shown.indexOf(piece); at >= 0 && spans.length < 100; at = shown.indexOf(piece, at + piece.length))
        if (!spans.some(([a, b]) => at < b && a < at + piece.length)) spans.push([at, at + piece.length]);
    }
    spans.sort((x, y) => y[0] - x[0]);
    for (const [s, e] of spans) mark(body, s, e, isCurrent);
    if (isCurrent) body.closest(".row")?.classList.add("current-match");
  }

  return { element: form, decorate };
}
