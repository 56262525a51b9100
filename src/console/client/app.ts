/**
 * The console's browser side: one function whose source text script.ts ships as
 * console.js. It must use nothing from outside its own body except the ANSI renderer it
 * is given and the browser's globals. It builds the DOM with textContent only (log lines
 * and package data never become HTML).
 * Why: docs/decisions/console.md, "app.ts: why the log viewer is virtualised".
 */
import type { AnsiRun } from "./ansi.js";
import type { SectionFolds, WireSections } from "./sections.js";
import type { SearchBox, SearchHost } from "./search.js";
import type { HomeKit, JobSummary, PageKit } from "./kit.js";

/** A line as the job endpoints send it: text, flags (1 stderr, 2 marker, 4 server time), time (ms, 0 = none). */
/** [text, flags, time?, skipped?]: a cut log's drop marker carries the positions after it that hold no line. */
type Wire = [string, number, number?, number?];

/** Runs the console page in the browser. */
export function consoleMain(
  parseAnsi: (line: string) => AnsiRun[],
  createFolds: () => SectionFolds,
  logSearch: (host: SearchHost) => SearchBox,
  renderPackagePage: (kit: PageKit, name: string) => Promise<void>,
  renderHomePage: (kit: HomeKit, only?: "jobs" | "packages") => Promise<void>,
): void {
  const ROW = 20;
  const CHUNK = 500;
  const CACHE_CHUNKS = 200;
  // Browsers cap an element's height (Chrome ~33.5 million px): beyond this the
  // scrollbar maps proportionally onto the lines.
  const MAX_PX = 8_000_000;

  const main = document.getElementById("main") as HTMLElement;
  const meta = (name: string) => document.querySelector<HTMLMetaElement>(`meta[name="${name}"]`)?.content ?? "";
  const base = meta("console-base");
  const csrf = meta("csrf-token");

  type Child = Node | string | null | undefined | false;
  function h<K extends keyof HTMLElementTagNameMap>(
    tag: K,
    attrs: Record<string, string | boolean | undefined> = {},
    ...children: Child[]
  ): HTMLElementTagNameMap[K] {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === false) continue;
      if (key === "text") el.textContent = String(value);
      else el.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined && child !== false) el.append(child);
    return el;
  }

  async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (init.method === "POST") headers["x-csrf-token"] = csrf;
    const response = await fetch(`${base}/api${path}`, { credentials: "same-origin", ...init, headers });
    const body = (await response.json().catch(() => null)) as (T & { detail?: string }) | null;
    if (!response.ok) throw new Error(body?.detail ?? `HTTP ${response.status}`);
    return body as T;
  }

  const fmtTime = (iso: string | null | undefined) =>
    iso
      ? new Date(iso)
          .toISOString()
          .replace("T", " ")
          .replace(/\.\d+Z$/, " UTC")
      : "—";
  function fmtDuration(ms: number | null): string {
    if (ms === null) return "—";
    const s = Math.round(ms / 1000);
    return s < 60
      ? `${s} s`
      : s < 3600
        ? `${Math.floor(s / 60)} min ${s % 60} s`
        : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  }
  function errorBox(error: unknown): HTMLElement {
    return h("p", {
      class: "error",
      role: "alert",
      text: `Error: ${error instanceof Error ? error.message : String(error)}`,
    });
  }

  // One vocabulary with the CLI (`runner-depot jobs`) and the API: the state is the API's
  // status word (open, finished, cancelled, lost); the outcome is success or failed for a
  // finished job, the state itself otherwise, "—" while open (docs/decisions/console.md).
  function stateBadge(job: JobSummary): HTMLElement {
    const failed = job.status === "finished" && job.success === false;
    return h("span", { class: `badge s-${failed ? "failed" : job.status}`, text: job.status });
  }

  function outcomeLabel(job: JobSummary): string {
    if (job.status === "open") return "—";
    if (job.outcome === "finished") return job.success ? "success" : "failed";
    return job.outcome ?? job.status;
  }

  async function renderJob(id: string): Promise<void> {
    document.title = `Job ${id.slice(0, 8)} · runner-depot`;
    let job = await api<JobSummary>(`/jobs/${id}`);
    const summary = h("dl", { class: "summary" });
    const cancel = h("button", { type: "button", class: "danger", text: "Cancel job", hidden: !job.cancellable });
    const follow = h("input", { type: "checkbox", id: "follow", checked: true });
    const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
    // While the job runs, the line count is the live one (the summary's counts are final ones).
    let liveLines: number | null = null;
    function showSummary(): void {
      const open = job.status === "open";
      const rows: Array<[string, Node | string]> = [
        ["State", stateBadge(job)],
        ["Outcome", outcomeLabel(job)],
        ["Exit code", job.exitCode === null ? "—" : String(job.exitCode)],
        ["Duration", fmtDuration(job.durationMs)],
        [
          "Lines",
          open && liveLines !== null
            ? `${liveLines} so far`
            : `${job.lines.stdout} stdout, ${job.lines.stderr} stderr${job.logTruncated ? " (log truncated at its cap)" : ""}`,
        ],
        ["Repository", job.repoUrl || "—"],
        ["Commit", job.commitSha || "—"],
        ["Started", open && job.startedAt === null ? "not yet (no output so far)" : fmtTime(job.startedAt)],
        ["Ended", fmtTime(job.endedAt)],
        [
          "Published",
          (job.published ?? []).length === 0
            ? "—"
            : h(
                "ul",
                { id: "published", class: "inline-list" },
                ...(job.published ?? []).map((p) =>
                  h(
                    "li",
                    {},
                    h("a", {
                      class: "mono",
                      href: `${base}/packages/${encodeURIComponent(p.name)}?version=${encodeURIComponent(p.version)}`,
                      text: `${p.name}@${p.version}`,
                    }),
                  ),
                ),
              ),
        ],
      ];
      summary.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]));
      cancel.hidden = job.status !== "open";
    }
    showSummary();

    // The viewer: a scrolling viewport, a spacer as tall as the log, and the visible rows.
    const viewport = h("div", {
      class: "log-viewport",
      tabindex: "0",
      role: "region",
      "aria-label": "Job log",
      id: "log",
    });
    const spacer = h("div", { class: "log-spacer" });
    const rows = h("div", { class: "log-rows" });
    viewport.append(spacer, rows);
    viewport.dataset.streamErrors = "0";

    // Line times: the wall clock (local time of day, ms) or the time since the job started (its first item).
    const timeMode = h(
      "select",
      { id: "time-mode" },
      h("option", { value: "wall", text: "Wall clock" }),
      h("option", { value: "since", text: "Since job start" }),
    );
    timeMode.addEventListener("change", () => draw());
    const pad = (n: number, width = 2) => String(n).padStart(width, "0");
    function fmtLineTime(ms: number): string {
      if (timeMode.value === "since") {
        const start = job.startedAt ? Date.parse(job.startedAt) : ms;
        const d = Math.round(ms - start);
        const a = Math.abs(d);
        const h = Math.floor(a / 3_600_000);
        const m = Math.floor((a % 3_600_000) / 60_000);
        const s = Math.floor((a % 60_000) / 1000);
        return `${d < 0 ? "-" : "+"}${h > 0 ? `${h}:${pad(m)}` : String(m)}:${pad(s)}.${pad(a % 1000, 3)}`;
      }
      const t = new Date(Math.floor(ms));
      return `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}.${pad(t.getMilliseconds(), 3)}`;
    }
    function timeTitle(ms: number, serverTime: boolean): string {
      const us = Math.round(ms * 1000);
      const iso = new Date(Math.floor(us / 1000)).toISOString().slice(0, 23) + pad(us % 1000, 3) + "Z";
      return serverTime ? `${iso} (received by the server: the agent sent no time)` : iso;
    }

    let total = job.storedLines;
    let target: number | null = null;
    const chunks = new Map<number, Wire[]>();
    const loading = new Set<number>();
    // Search (search.ts): jumps with goToLine, marks matches as rows are drawn.
    const search = logSearch({ id, api, goToLine, redraw: () => draw(), parseAnsi });

    // Sections (sections.ts): the viewer lays out rows, and a folded section's lines take none.
    const folds = createFolds();
    function layout(): { first: number; offset: number } {
      const visible = Math.max(1, Math.ceil(viewport.clientHeight / ROW));
      const count = folds.rows(total);
      viewport.dataset.rows = String(count);
      const full = count * ROW;
      const height = Math.min(full, MAX_PX);
      spacer.style.height = `${Math.max(height, 1)}px`;
      const top = viewport.scrollTop;
      if (full <= MAX_PX) return { first: Math.floor(top / ROW), offset: top - (top % ROW) };
      const range = Math.max(1, height - viewport.clientHeight);
      const first = Math.round((Math.min(top, range) / range) * Math.max(0, count - visible));
      return { first, offset: top };
    }

    function lineAt(n: number): Wire | null {
      const chunk = chunks.get(Math.floor(n / CHUNK));
      return chunk?.[n % CHUNK] ?? null;
    }

    async function fetchChunk(c: number): Promise<void> {
      if (loading.has(c)) return;
      loading.add(c);
      try {
        // Lines by position: past a cut log's drop marker the next line is `skipped` positions further on. A window
        // ends at 4 MiB of text (a log of long lines), so the chunk is asked for again from where it ended; asking
        // from its start again would get the same short window on every draw.
        const placed: Wire[] = [];
        let n = 0;
        // Up to the lines known to be stored: a log's last chunk is short, not cut.
        while (n < CHUNK && c * CHUNK + n < total) {
          const from = c * CHUNK + n;
          const page = await api<{ from: number; lines: Wire[] }>(`/jobs/${id}/lines?from=${from}&limit=${CHUNK}`);
          if (page.lines.length === 0) break;
          for (const line of page.lines) {
            if (n >= CHUNK) break;
            placed[n] = line;
            n += 1 + (line[3] ?? 0);
          }
        }
        const have = chunks.get(c);
        // A live tail may have filled this chunk further meanwhile: keep the longer copy.
        if (!have || have.length < placed.length) chunks.set(c, placed);
        while (chunks.size > CACHE_CHUNKS) chunks.delete(chunks.keys().next().value!);
        draw();
      } catch (error) {
        status.replaceChildren(errorBox(error));
      } finally {
        loading.delete(c);
      }
    }

    function renderRow(n: number): HTMLElement {
      const row = renderLine(n);
      folds.decorate(row, n, total);
      return row;
    }

    function renderLine(n: number): HTMLElement {
      const line = lineAt(n);
      const number = n + 1;
      const ln = h("a", { class: "ln", href: `#L${number}`, text: String(number), "aria-label": `Line ${number}` });
      if (!line) {
        const c = Math.floor(n / CHUNK);
        const have = chunks.get(c);
        if (!have || have.length < Math.min(CHUNK, total - c * CHUNK)) void fetchChunk(c);
        return h(
          "div",
          { class: "row pending", "data-line": String(number) },
          ln,
          h("span", { class: "ts" }),
          h("span", { class: "stream" }),
          h("span", { class: "text", text: "…" }),
        );
      }
      const [text, flags, time = 0] = line;
      const err = (flags & 1) !== 0;
      const marker = (flags & 2) !== 0;
      const row = h("div", {
        class: `row${err ? " err" : ""}${marker ? " marker" : ""}${target === number ? " target" : ""}`,
        "data-line": String(number),
      });
      const body = h("span", { class: "text" });
      if (marker) body.append(h("span", { class: "visually-hidden", text: "Note from runner-depot: " }));
      for (const run of parseAnsi(text)) {
        if (!run.cls && !run.fg && !run.bg) {
          body.append(run.text);
          continue;
        }
        const span = h("span", { class: run.cls || undefined, text: run.text });
        if (run.fg) span.style.color = run.fg;
        if (run.bg) span.style.backgroundColor = run.bg;
        body.append(span);
      }
      search.decorate(n, body, text);
      const ts =
        time > 0
          ? h("span", {
              class: (flags & 4) !== 0 ? "ts server" : "ts",
              text: fmtLineTime(time),
              title: timeTitle(time, (flags & 4) !== 0),
            })
          : h("span", { class: "ts" });
      row.append(
        ln,
        ts,
        h("span", { class: "stream", text: err ? "err" : "", title: err ? "stderr" : undefined }),
        body,
      );
      return row;
    }

    let scheduled = false;
    function draw(): void {
      if (scheduled) return;
      scheduled = true;
      requestAnimationFrame(() => {
        scheduled = false;
        const { first, offset } = layout();
        const visible = Math.ceil(viewport.clientHeight / ROW) + 1;
        const last = Math.min(folds.rows(total), first + visible);
        rows.style.transform = `translateY(${offset}px)`;
        const fresh: HTMLElement[] = [];
        for (let r = first; r < last; r++) fresh.push(renderRow(folds.lineOf(r, total)));
        rows.replaceChildren(...fresh);
      });
    }

    function atBottom(): boolean {
      return viewport.scrollTop + viewport.clientHeight >= viewport.scrollHeight - ROW;
    }
    function toBottom(): void {
      layout();
      viewport.scrollTop = viewport.scrollHeight;
    }
    function goToLine(number: number): void {
      target = number;
      follow.checked = false;
      // A line inside folded sections opens them; the scroll is by row.
      folds.reveal(number - 1);
      const row = folds.rowOf(number - 1, total);
      const count = folds.rows(total);
      layout();
      const full = count * ROW;
      if (full <= MAX_PX) viewport.scrollTop = Math.max(0, row * ROW - viewport.clientHeight / 3);
      else viewport.scrollTop = (row / Math.max(1, count)) * (Math.min(full, MAX_PX) - viewport.clientHeight);
      draw();
    }

    // A header's fold button folds or opens its section and keeps the header in view.
    rows.addEventListener("click", (event) => {
      const button = (event.target as HTMLElement).closest<HTMLElement>("button.fold");
      if (!button) return;
      const line = Number(button.dataset.line);
      folds.toggle(line);
      const keep = target;
      goToLine(line + 1);
      target = keep;
      draw();
    });
    let sectionsAsked: Promise<void> | null = null;
    let sectionsAgain = false;
    /** Asks for the job's sections (once at a time; again after, when asked meanwhile). */
    function loadSections(): void {
      if (sectionsAsked) {
        sectionsAgain = true;
        return;
      }
      sectionsAsked = api<WireSections>(`/jobs/${id}/sections`)
        .then((record) => {
          folds.load(record);
          viewport.dataset.sections = String(record.sections.length);
          draw();
        })
        .catch((error: unknown) => status.replaceChildren(errorBox(error)))
        .finally(() => {
          sectionsAsked = null;
          if (sectionsAgain) {
            sectionsAgain = false;
            loadSections();
          }
        });
    }

    viewport.addEventListener(
      "scroll",
      () => {
        // Scrolling up stops following; coming back to the end resumes it.
        if (job.status === "open") follow.checked = atBottom();
        draw();
      },
      { passive: true },
    );
    window.addEventListener("resize", draw);
    window.addEventListener("hashchange", () => {
      const m = /^#L(\d+)$/.exec(location.hash);
      if (m) goToLine(Number(m[1]));
    });
    follow.addEventListener("change", () => {
      if (follow.checked) toBottom();
    });

    function appendLines(from: number, lines: Wire[]): void {
      if (from !== total) {
        // The stream must continue exactly where the log stands: count any gap or repeat.
        viewport.dataset.streamErrors = String(Number(viewport.dataset.streamErrors) + 1);
        console.warn(`log stream out of step: got lines from ${from}, expected ${total}`);
        if (from > total || from + lines.length <= total) return;
        lines = lines.slice(total - from);
        from = total;
      }
      // A drop marker (its 4th element) means the log was cut: the sections' answer says where.
      if (lines.some((l) => folds.mayBeMarker(l[0]) || l[3] !== undefined)) loadSections();
      let n = from;
      for (const line of lines) {
        const c = Math.floor(n / CHUNK);
        let chunk = chunks.get(c);
        if (!chunk && n % CHUNK === 0) chunks.set(c, (chunk = []));
        if (chunk && chunk.length === n % CHUNK) chunk.push(line);
        n += 1 + (line[3] ?? 0);
      }
      total = n;
      viewport.dataset.lines = String(total);
      if (follow.checked) toBottom();
      draw();
    }

    function describe(): void {
      if (job.status === "open") {
        status.textContent = `Live: ${total} lines so far.`;
        if (liveLines !== total) {
          liveLines = total;
          showSummary();
        }
      } else
        status.textContent = `Ended (${outcomeLabel(job)}${job.exitCode !== null ? `, exit code ${job.exitCode}` : ""}): ${total} lines.`;
    }

    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      try {
        await api(`/jobs/${id}/cancel`, { method: "POST" });
        job = await api<JobSummary>(`/jobs/${id}`);
        showSummary();
        describe();
      } catch (error) {
        status.replaceChildren(errorBox(error));
      } finally {
        cancel.disabled = false;
      }
    });

    main.replaceChildren(
      h("h1", {}, "Job ", h("span", { class: "mono", text: id })),
      summary,
      h(
        "div",
        { class: "toolbar" },
        h("a", {
          class: "button",
          href: `${base}/api/jobs/${id}/raw`,
          download: `job-${id}.log`,
          text: "Download raw log",
        }),
        h("a", {
          class: "button",
          href: `${base}/api/jobs/${id}/raw?timestamps=1`,
          download: `job-${id}.log`,
          text: "With times",
          "aria-label": "Download raw log with times",
        }),
        h("span", {}, h("label", { for: "time-mode", text: "Times: " }), timeMode),
        cancel,
        h("span", {}, follow, " ", h("label", { for: "follow", text: "Follow the end of the log" })),
      ),
      search.element,
      status,
      viewport,
    );
    viewport.dataset.lines = String(total);
    describe();
    const hash = /^#L(\d+)$/.exec(location.hash);
    if (hash) goToLine(Number(hash[1]));
    else toBottom();
    draw();
    // Sections, then the failing one opened and shown (unless a line link asked for another place).
    loadSections();
    void (sectionsAsked as Promise<void> | null)?.then(() => {
      const failed = folds.failing();
      if (!failed || hash) return;
      goToLine(Math.min(total, (failed.end ?? total - 1) + 1));
      target = null;
      draw();
    });

    if (job.status === "open") {
      // Resumes by itself after a drop: EventSource sends Last-Event-ID (the position after
      // the last line it received), so the server continues exactly there.
      const events = new EventSource(`${base}/api/jobs/${id}/events?from=${total}`, { withCredentials: true });
      let startAsked = false;
      viewport.dataset.stream = "connecting";
      events.addEventListener("open", () => {
        viewport.dataset.stream = "open";
        describe();
      });
      events.addEventListener("lines", (event) => {
        const data = JSON.parse((event as MessageEvent<string>).data) as { from: number; lines: Wire[] };
        appendLines(data.from, data.lines);
        describe();
        // The first output starts the job: take its start time from the service once.
        if (job.startedAt === null && data.lines.length > 0 && !startAsked) {
          startAsked = true;
          void api<JobSummary>(`/jobs/${id}`).then(
            (fresh) => {
              if (job.status === "open") job = { ...job, startedAt: fresh.startedAt };
              showSummary();
            },
            () => undefined,
          );
        }
      });
      events.addEventListener("end", (event) => {
        events.close();
        viewport.dataset.stream = "ended";
        job = { ...job, ...(JSON.parse((event as MessageEvent<string>).data) as JobSummary) };
        showSummary();
        describe();
        // Ended: the sections still open are final, and a failure opens its section.
        loadSections();
      });
      events.addEventListener("error", () => {
        if (events.readyState === EventSource.CLOSED) return;
        viewport.dataset.stream = "reconnecting";
        status.textContent = `Reconnecting… (${total} lines so far)`;
      });
    }
  }

  const page = main.dataset.page;
  const subject = main.dataset.subject ?? "";
  const run =
    page === "job"
      ? renderJob(subject)
      : page === "package"
        ? renderPackagePage({ h, api, base, main, fmtTime }, subject)
        : renderHomePage(
            { h, api, base, main, fmtTime, fmtDuration, errorBox, stateBadge, outcomeLabel },
            page === "jobs" || page === "packages" ? page : undefined,
          );
  run.catch((error: unknown) => main.replaceChildren(h("h1", { text: "runner-depot console" }), errorBox(error)));
}
