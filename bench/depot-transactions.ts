/**
 * Depot transaction benchmark: one transaction of 10,000 small files through the HTTP
 * contract (fs store with fsync, the server in a child process, raw `fetch` from this
 * process at concurrency 8): the time of the additions (and the per-item cost of the
 * first and the last thousand, which must be flat), `GET /summary` (first page and the
 * whole paged walk), and the commit. The peer is the same transaction with 1,000 items,
 * so the ratio says how the cost grows with the transaction's size.
 *
 * `BENCH_ITEMS=2000 npm run bench -- depot-transactions` runs a smaller transaction.
 */
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startDepot } from "./children.js";

const CONCURRENCY = 8;

/** What one transaction of `items` files cost, ms. */
export interface TransactionFigures {
  items: number;
  addMs: number;
  /** Mean ms per addition over the first and the last tenth (flat cost: about equal). */
  firstTenthMs: number;
  lastTenthMs: number;
  summaryFirstPageMs: number;
  summaryFirstPageBytes: number;
  summaryWalkMs: number;
  summaryPages: number;
  commitMs: number;
}

/** Publishes `name@1.0.0` with `items` files through `url`, timing each phase. */
export async function measureTransaction(url: string, name: string, items: number): Promise<TransactionFigures> {
  const opened = await fetch(`${url}/trans/${name}@1.0.0`, { method: "POST" });
  if (opened.status !== 201) throw new Error(`open: ${opened.status} ${await opened.text()}`);
  const id = ((await opened.json()) as { transaction: string }).transaction;
  const finished = new Array<number>(items);
  const started = performance.now();
  let next = 0;
  const worker = async () => {
    while (next < items) {
      const i = next++;
      // Ten files per directory, a hundred directories per level: paths like real trees.
      const p = `d${Math.floor(i / 1000)}/e${Math.floor(i / 10) % 100}/f${i}.txt`;
      const r = await fetch(`${url}/add/${id}/file`, { method: "POST", headers: { "pkg-path": p }, body: `file ${i}\n` });
      if (r.status !== 201) throw new Error(`add ${p}: ${r.status} ${await r.text()}`);
      await r.arrayBuffer();
      finished[i] = performance.now();
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const addMs = performance.now() - started;
  const tenth = Math.max(1, Math.floor(items / 10));
  const sorted = [...finished].sort((a, b) => a - b);
  const firstTenthMs = (sorted[tenth - 1]! - started) / tenth;
  const lastTenthMs = (sorted[items - 1]! - sorted[items - tenth - 1]!) / tenth;

  let summaryFirstPageMs = 0;
  let summaryFirstPageBytes = 0;
  let summaryPages = 0;
  const walkStart = performance.now();
  let page: string | null = `${url}/summary/${id}`;
  let seen = 0;
  while (page !== null) {
    const t0 = performance.now();
    const r: Response = await fetch(page);
    const text = await r.text();
    if (r.status !== 200) throw new Error(`summary: ${r.status} ${text.slice(0, 200)}`);
    if (summaryPages === 0) {
      summaryFirstPageMs = performance.now() - t0;
      summaryFirstPageBytes = Buffer.byteLength(text);
    }
    summaryPages++;
    const body = JSON.parse(text) as { items: unknown[]; next?: string | null };
    seen += body.items.length;
    const link = r.headers.get("link");
    const rel = link ? /<([^>]+)>;\s*rel="next"/.exec(link) : null;
    page = rel ? new URL(rel[1]!, page).href : null;
  }
  const summaryWalkMs = performance.now() - walkStart;
  if (seen !== items) throw new Error(`summary listed ${seen} items, not ${items}`);

  const c0 = performance.now();
  const committed = await fetch(`${url}/commit/${id}`, { method: "POST" });
  if (committed.status !== 201) throw new Error(`commit: ${committed.status} ${await committed.text()}`);
  await committed.arrayBuffer();
  const commitMs = performance.now() - c0;
  return { items, addMs, firstTenthMs, lastTenthMs, summaryFirstPageMs, summaryFirstPageBytes, summaryWalkMs, summaryPages, commitMs };
}

const f1 = (n: number) => n.toFixed(1);
const f0 = (n: number) => n.toFixed(0);

export async function run(): Promise<string> {
  const big = Number(process.env.BENCH_ITEMS) > 0 ? Number(process.env.BENCH_ITEMS) : 10_000;
  const small = Math.max(10, Math.round(big / 10));
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-depot-trans-"));
  const depot = await startDepot(path.join(work, "store"));
  try {
    const peer = await measureTransaction(depot.url, "small", small);
    const ours = await measureTransaction(depot.url, "big", big);
    const row = (label: string, a: number, b: number, unit: string, digits = 1) =>
      `| ${label} | ${a.toFixed(digits)} ${unit} | ${b.toFixed(digits)} ${unit} | ${(a / b).toFixed(2)} |`;
    return [
      "## Depot: one transaction of many items",
      "",
      `One transaction of ${big.toLocaleString("en")} small files (three-level paths) added through HTTP at concurrency ${CONCURRENCY}`,
      `(fs store with fsync, server in a child process), then \`GET /summary\` walked page by page, then the commit.`,
      `Peer: the same with ${small.toLocaleString("en")} files in the same run; a flat per-item cost keeps the per-item rows near 1×.`,
      "",
      `| measure | ${big.toLocaleString("en")} items | ${small.toLocaleString("en")} items (peer) | ratio |`,
      "|---|---:|---:|---:|",
      row("all additions", ours.addMs / 1000, peer.addMs / 1000, "s", 2),
      row("per addition, mean", ours.addMs / big, peer.addMs / small, "ms", 2),
      row("per addition, first tenth", ours.firstTenthMs, peer.firstTenthMs, "ms", 2),
      row("per addition, last tenth", ours.lastTenthMs, peer.lastTenthMs, "ms", 2),
      row("`GET /summary` first page", ours.summaryFirstPageMs, peer.summaryFirstPageMs, "ms"),
      `| \`GET /summary\` first page, bytes | ${f0(ours.summaryFirstPageBytes)} | ${f0(peer.summaryFirstPageBytes)} | ${(ours.summaryFirstPageBytes / peer.summaryFirstPageBytes).toFixed(2)} |`,
      `| \`GET /summary\` whole walk | ${f1(ours.summaryWalkMs)} ms (${ours.summaryPages} pages) | ${f1(peer.summaryWalkMs)} ms (${peer.summaryPages} pages) | ${(ours.summaryWalkMs / peer.summaryWalkMs).toFixed(2)} |`,
      row("commit", ours.commitMs / 1000, peer.commitMs / 1000, "s", 2),
      "",
    ].join("\n");
  } finally {
    depot.child.kill("SIGTERM");
    await new Promise((resolve) => depot.child.once("exit", resolve));
    await rm(work, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) console.log(await run());
