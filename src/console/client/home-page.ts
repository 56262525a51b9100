/**
 * The console's home, Jobs and Packages pages: the job list (filtered by state, paged) and the package catalog
 * (filtered by name, paged). Like app.ts this is one self-contained function whose source text script.ts ships: it
 * uses nothing from outside its body but the kit app.ts hands it and the browser's globals.
 */
import type { HomeKit, JobSummary } from "./kit.js";

/** Renders the home page (`only`: the Jobs or the Packages page, `<base>/jobs` or `<base>/packages`, else both). */
export async function renderHomePage(kit: HomeKit, only?: "jobs" | "packages"): Promise<void> {
  const { h, api, base, main, fmtTime, fmtDuration, errorBox, stateBadge, outcomeLabel } = kit;
  // `only`: the Jobs or the Packages page (`<base>/jobs`, `<base>/packages`), else both.
  async function renderHome(): Promise<void> {
    document.title = `${only === "jobs" ? "Jobs" : only === "packages" ? "Packages" : "Console"} · runner-depot`;
    const config = await api<{ jobs: boolean; packages: boolean }>("/config");
    main.replaceChildren(h("h1", { text: "runner-depot console" }));
    if (config.jobs && only !== "packages") main.append(jobsSection());
    if (config.packages && only !== "jobs") main.append(packagesSection());
    if (location.hash === "#packages" || location.hash === "#jobs")
      document.getElementById(location.hash.slice(1))?.scrollIntoView();
  }

  function jobsSection(): HTMLElement {
    const select = h(
      "select",
      { id: "job-state" },
      ...["all", "open", "finished", "cancelled", "lost"].map((s) => h("option", { value: s, text: s })),
    );
    const body = h("tbody");
    const more = h("button", { type: "button", text: "Load more", hidden: true });
    const status = h("p", { class: "status muted", role: "status" });
    let cursor: string | null = null;
    async function load(reset: boolean): Promise<void> {
      if (reset) {
        cursor = null;
        body.replaceChildren();
      }
      status.textContent = "Loading jobs…";
      try {
        const q = new URLSearchParams({ limit: "50" });
        if (select.value !== "all") q.set("status", select.value);
        if (cursor) q.set("cursor", cursor);
        const page = await api<{ jobs: JobSummary[]; next: string | null }>(`/jobs?${q}`);
        for (const job of page.jobs) {
          body.append(
            h(
              "tr",
              {},
              h(
                "td",
                {},
                h("a", {
                  href: `${base}/jobs/${job.requestId}`,
                  class: "mono",
                  // The whole ID: the one `runner-depot logs <id>` and `cancel <id>` take.
                  text: job.requestId,
                  "aria-label": `Job ${job.requestId}`,
                }),
              ),
              h("td", {}, stateBadge(job)),
              h("td", { text: outcomeLabel(job) }),
              h("td", { class: "num", text: job.exitCode === null ? "—" : String(job.exitCode) }),
              h("td", { class: "num", text: fmtDuration(job.durationMs) }),
              h("td", { class: "num", text: `${job.lines.stdout} / ${job.lines.stderr}` }),
              h("td", { class: "hide-narrow", text: job.repoUrl || "—" }),
              h("td", { class: "mono hide-narrow", text: job.commitSha ? job.commitSha.slice(0, 12) : "—" }),
              h("td", { class: "hide-narrow", text: fmtTime(job.startedAt ?? job.createdAt) }),
            ),
          );
        }
        cursor = page.next;
        more.hidden = cursor === null;
        const shown = body.children.length;
        status.textContent = shown === 0 ? "No jobs." : `${shown} ${shown === 1 ? "job" : "jobs"} shown.`;
      } catch (error) {
        status.replaceChildren(errorBox(error));
      }
    }
    select.addEventListener("change", () => void load(true));
    more.addEventListener("click", () => void load(false));
    void load(true);
    return h(
      "section",
      { id: "jobs", "aria-labelledby": "jobs-title" },
      h("h2", { id: "jobs-title", text: "Jobs" }),
      h("div", { class: "toolbar" }, h("label", { for: "job-state", text: "State" }), select),
      h(
        "div",
        { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Jobs table" },
        h(
          "table",
          {},
          h("caption", { class: "visually-hidden", text: "Recent jobs, newest first" }),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ...[
                "Job",
                "State",
                "Outcome",
                "Exit",
                "Duration",
                "Lines out / err",
                "Repository",
                "Commit",
                "Started",
              ].map((t, i) =>
                h("th", {
                  scope: "col",
                  class: [3, 4, 5].includes(i) ? "num" : i >= 6 ? "hide-narrow" : undefined,
                  text: t,
                }),
              ),
            ),
          ),
          body,
        ),
      ),
      status,
      more,
    );
  }

  function packagesSection(): HTMLElement {
    const input = h("input", { id: "pkg-filter", type: "search", autocomplete: "off", spellcheck: "false" });
    const body = h("tbody");
    const more = h("button", { type: "button", text: "Load more", hidden: true });
    const status = h("p", { class: "status muted", role: "status" });
    let cursor: string | null = null;
    let generation = 0;
    async function load(reset: boolean): Promise<void> {
      const mine = reset ? ++generation : generation;
      if (reset) cursor = null;
      status.textContent = "Loading packages…";
      try {
        const q = new URLSearchParams({ limit: "50" });
        if (input.value.trim()) q.set("q", input.value.trim());
        if (cursor) q.set("cursor", cursor);
        const page = await api<{
          packages: Array<{ name: string; latest: string; versions: string[]; updatedAt?: string }>;
          next: string | null;
        }>(`/packages?${q}`);
        if (mine !== generation) return;
        if (reset) body.replaceChildren();
        for (const pkg of page.packages) {
          body.append(
            h(
              "tr",
              {},
              h("td", {}, h("a", { href: `${base}/packages/${encodeURIComponent(pkg.name)}`, text: pkg.name })),
              h("td", { class: "mono", text: pkg.latest }),
              h("td", { class: "num", text: String(pkg.versions.length) }),
              h("td", { class: "hide-narrow", text: fmtTime(pkg.updatedAt) }),
            ),
          );
        }
        cursor = page.next;
        more.hidden = cursor === null;
        status.textContent =
          body.children.length === 0
            ? cursor
              ? "No match yet; load more to keep looking."
              : "No packages."
            : `${body.children.length} packages shown.`;
      } catch (error) {
        status.replaceChildren(errorBox(error));
      }
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    input.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => void load(true), 200);
    });
    more.addEventListener("click", () => void load(false));
    void load(true);
    return h(
      "section",
      { id: "packages", "aria-labelledby": "packages-title" },
      h("h2", { id: "packages-title", text: "Packages" }),
      h("div", { class: "toolbar" }, h("label", { for: "pkg-filter", text: "Filter by name" }), input),
      h(
        "div",
        { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Packages table" },
        h(
          "table",
          {},
          h("caption", { class: "visually-hidden", text: "Package catalog" }),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              h("th", { scope: "col", text: "Name" }),
              h("th", { scope: "col", text: "Latest" }),
              h("th", { scope: "col", class: "num", text: "Versions" }),
              h("th", { scope: "col", class: "hide-narrow", text: "Updated" }),
            ),
          ),
          body,
        ),
      ),
      status,
      more,
    );
  }

  // ---------------------------------------------------------------- job page

  await renderHome();
}
