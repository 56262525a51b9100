/**
 * The console's package page: a version's summary, install commands, dependencies, dependants, licences and files.
 * Like app.ts this is one self-contained function whose source text script.ts ships: it uses nothing from outside
 * its own body but the page kit app.ts hands it and the browser's globals, and builds the DOM with textContent only.
 */

import type { PageKit } from "./kit.js";

/** Renders package `name`'s page (the version in `?version=`, else its latest) into `kit.main`. */
export async function renderPackagePage(kit: PageKit, name: string): Promise<void> {
  const { h, api, base, main, fmtTime } = kit;
  const fmtBytes = (n: number) =>
    n < 1024
      ? `${n} B`
      : n < 1048576
        ? `${(n / 1024).toFixed(1)} KiB`
        : n < 1073741824
          ? `${(n / 1048576).toFixed(1)} MiB`
          : `${(n / 1073741824).toFixed(2)} GiB`;
  function fmtMode(type: string, mode: number): string {
    const bits = ["r", "w", "x"];
    let out = type === "dir" ? "d" : type === "link" ? "l" : "-";
    for (let i = 8; i >= 0; i--) out += mode & (1 << i) ? bits[(8 - i) % 3] : "-";
    return `${out} (${mode.toString(8).padStart(4, "0")})`;
  }

  interface VersionEntry {
    version: string;
    publishedAt: string;
    size: number;
    itemCount: number;
    attributes: Record<string, string>;
    /** Present when the version is yanked (issue 27): resolution skips it; an exact request still gets it. */
    yanked?: { reason: string; at: string };
  }

  document.title = `${name} · runner-depot`;
  const info = await api<{
    name: string;
    latest: string;
    versions: VersionEntry[];
    dependants: string[];
    dependantsComplete: boolean;
    depotUrl: string;
  }>(`/packages/${encodeURIComponent(name)}`);
  const wanted = new URLSearchParams(location.search).get("version");
  const selected = info.versions.some((v) => v.version === wanted) ? wanted! : info.latest;
  const detail = await api<{
    version: string;
    publishedAt: string;
    attributes: Record<string, string>;
    requires: Array<{ name: string; range: string }>;
    licenses: Array<{ name: string; size: number }>;
    items: Array<{ type: string; path: string; mode: number; size: number; target?: string }>;
    itemCount: number;
    /** The jobs whose provenance this version carries (issue 26). */
    builtBy?: Array<{ requestId: string; builderId: string }>;
    /** The yank reason, when this version is yanked (issue 27). */
    yanked?: string;
  }>(`/packages/${encodeURIComponent(name)}/${encodeURIComponent(selected)}`);

  const pkgLink = (n: string) => h("a", { href: `${base}/packages/${encodeURIComponent(n)}`, text: n });
  function copyBlock(label: string, command: string): HTMLElement {
    const code = h("code", { text: command });
    const button = h("button", { type: "button", text: "Copy", "aria-label": `Copy: ${label}` });
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(command);
        button.textContent = "Copied";
      } catch {
        // No clipboard (insecure context): select the text for Ctrl-C instead.
        const range = document.createRange();
        range.selectNodeContents(code);
        getSelection()?.removeAllRanges();
        getSelection()?.addRange(range);
        button.textContent = "Selected";
      }
      setTimeout(() => (button.textContent = "Copy"), 2000);
    });
    return h("div", { class: "install" }, h("pre", { "aria-label": label, tabindex: "0" }, code), button);
  }

  const versions = h(
    "tbody",
    {},
    ...[...info.versions].reverse().map((v) =>
      h(
        "tr",
        v.yanked ? { class: "yanked", "data-version": v.version } : { "data-version": v.version },
        h(
          "td",
          {},
          v.version === selected
            ? h("strong", { class: "mono", text: v.version, "aria-current": "true" })
            : h("a", {
                class: "mono",
                href: `${base}/packages/${encodeURIComponent(name)}?version=${encodeURIComponent(v.version)}`,
                text: v.version,
              }),
          // The reason as text, never markup: it is the packager's free text.
          v.yanked ? h("span", { class: "yank-badge", title: v.yanked.reason, text: "yanked" }) : null,
          v.yanked ? h("div", { class: "yank-reason muted", text: v.yanked.reason }) : null,
        ),
        h("td", { text: fmtTime(v.publishedAt) }),
        h("td", { class: "num", text: fmtBytes(v.size) }),
        h("td", { class: "num", text: String(v.itemCount) }),
        h("td", {
          class: "hide-narrow",
          text:
            Object.entries(v.attributes)
              .map(([k, val]) => `${k}=${val}`)
              .join(", ") || "—",
        }),
      ),
    ),
  );

  const files = h(
    "tbody",
    {},
    ...detail.items.map((item) =>
      h(
        "tr",
        {},
        h("td", { text: item.type }),
        h("td", { class: "mono", text: item.path }),
        h("td", { class: "mono", text: fmtMode(item.type, item.mode) }),
        h("td", { class: "num", text: item.type === "file" ? fmtBytes(item.size) : "—" }),
        h("td", { class: "mono", text: item.type === "link" ? `→ ${item.target ?? ""}` : "" }),
      ),
    ),
  );

  const spec = `${name}@${selected}`;
  main.replaceChildren(
    h("h1", {}, name, " ", h("span", { class: "muted mono", text: selected })),
    h(
      "dl",
      { class: "summary" },
      h("dt", { text: "Latest" }),
      h("dd", { class: "mono", text: info.latest }),
      ...(detail.yanked !== undefined
        ? [h("dt", { text: "Yanked" }), h("dd", { id: "yanked", class: "yank-reason", text: detail.yanked })]
        : []),
      h("dt", { text: "Published" }),
      h("dd", { text: fmtTime(detail.publishedAt) }),
      h("dt", { text: "Licences" }),
      h("dd", { text: detail.licenses.map((l) => l.name).join(", ") || "none declared" }),
      ...(detail.builtBy ?? []).flatMap((b) => [
        h("dt", { text: "Provenance" }),
        h(
          "dd",
          { class: "built-by" },
          "built by ",
          h("a", { href: `${base}/jobs/${encodeURIComponent(b.requestId)}`, text: `job ${b.requestId}` }),
          b.builderId ? h("span", { class: "muted", text: ` (signed by ${b.builderId})` }) : "",
        ),
      ]),
      ...Object.entries(detail.attributes).flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]),
    ),
    h(
      "section",
      { "aria-labelledby": "install-title" },
      h("h2", { id: "install-title", text: "Install" }),
      copyBlock("runner-depot command", `runner-depot install ${spec} ./packages --url ${info.depotUrl}`),
      copyBlock("archive download with curl", `curl -fL -o ${name}-${selected}.tar ${info.depotUrl}/data/${spec}`),
    ),
    h(
      "section",
      { "aria-labelledby": "deps-title" },
      h("h2", { id: "deps-title", text: `Dependencies of ${selected}` }),
      detail.requires.length === 0
        ? h("p", { class: "muted", text: "None." })
        : h(
            "ul",
            { id: "dependencies" },
            ...detail.requires.map((r) =>
              h("li", {}, pkgLink(r.name), " ", h("span", { class: "mono", text: r.range })),
            ),
          ),
    ),
    h(
      "section",
      { "aria-labelledby": "rdeps-title" },
      h("h2", { id: "rdeps-title", text: "Dependants" }),
      info.dependants.length === 0
        ? h("p", { class: "muted", text: "No package's newest version requires this one." })
        : h("ul", { id: "dependants" }, ...info.dependants.map((n) => h("li", {}, pkgLink(n)))),
      info.dependantsComplete
        ? null
        : h("p", { class: "muted", text: "Only part of the catalog was searched for dependants." }),
    ),
    h(
      "section",
      { "aria-labelledby": "versions-title" },
      h("h2", { id: "versions-title", text: "Versions" }),
      h(
        "div",
        { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Versions table" },
        h(
          "table",
          { id: "versions" },
          h("caption", { class: "visually-hidden", text: "Versions, newest first" }),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ...["Version", "Published", "Size", "Items", "Attributes"].map((t, i) =>
                h("th", {
                  scope: "col",
                  class: i === 2 || i === 3 ? "num" : i === 4 ? "hide-narrow" : undefined,
                  text: t,
                }),
              ),
            ),
          ),
          versions,
        ),
      ),
    ),
    h(
      "section",
      { "aria-labelledby": "files-title" },
      h("h2", { id: "files-title", text: `Files of ${selected}` }),
      detail.itemCount > detail.items.length
        ? h("p", { class: "muted", text: `Showing the first ${detail.items.length} of ${detail.itemCount} items.` })
        : null,
      h(
        "div",
        { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Files table" },
        h(
          "table",
          { id: "files" },
          h("caption", { class: "visually-hidden", text: `Files of ${spec}` }),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ...["Type", "Path", "Mode", "Size", "Link target"].map((t, i) =>
                h("th", { scope: "col", class: i === 3 ? "num" : undefined, text: t }),
              ),
            ),
          ),
          files,
        ),
      ),
    ),
  );
}
