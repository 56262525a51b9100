/**
 * Soak: kill -9 of a depot server process during commits (fs store, fsync on, the default).
 * Each round starts the depot server (test/fixtures/depot-server.ts, every store call
 * jittered by up to 2 ms so a kill lands at varied points) on the same data folder, first
 * settles the previous round's unanswered transactions (reads `GET /summary/<id>`: never
 * `committing` after a restart; an `open` one is committed again, as a client retrying
 * would), then prepares several publishes through real HTTP (open, add files), fires their
 * commits together and SIGKILLs the server at a random moment while they run. After the
 * last round a fresh process checks the whole store: every version listed by `/version`
 * downloads whole (sha256 of the body equals its ETag, Repr-Digest and listed digest), every
 * digest a commit answered is the one served, no transaction is stuck, and each committed
 * version appears exactly once in the change feed (`GET /catalog?since=0`, all pages).
 */
import { createHash } from "node:crypto";
import { add, httpDigest, openTransaction, storeDigest, tempDir } from "../test/fixtures/depot.js";
import { bundleDepotServer, spawnDepot, type DepotProcess } from "../test/fixtures/depot-process.js";

const PUBLISHES_PER_ROUND = 3;
const PACKAGES = ["soak-alpha", "soak-beta", "soak-gamma"];
/** Upper bound of the random delay between firing the commits and the kill, in ms. */
const KILL_WINDOW_MS = 150;

interface Publish {
  id: string;
  name: string;
  version: string;
  /** The digest the commit answered (201, or 200 on a retry), when it answered. */
  digest?: string;
}

function filesOf(name: string, version: string): Record<string, string> {
  return {
    "bin/app": `${name} ${version} build\n`.repeat(40),
    "etc/conf": `version=${version}\n`,
    "doc/readme": `readme of ${name}@${version}`,
  };
}

async function commit(url: string, id: string): Promise<{ status: number; digest?: string } | null> {
  try {
    const response = await fetch(`${url}/commit/${id}`, { method: "POST" });
    const body = (await response.json()) as { digest?: string };
    return { status: response.status, digest: body.digest };
  } catch {
    return null; // the connection died with the server
  }
}

/** The transaction's state after a restart (410 answers carry their code instead). */
async function stateOf(url: string, id: string): Promise<{ state: string; digest?: string }> {
  const response = await fetch(`${url}/summary/${id}?limit=1`);
  const body = (await response.json()) as { state?: string; digest?: string; code?: string };
  if (response.status === 200) return { state: body.state ?? "?", digest: body.digest };
  if (body.code === "TRANSACTION_GONE") return { state: "abandoned" };
  if (body.code === "TRANSACTION_EXPIRED") return { state: "expired" };
  return { state: `HTTP ${response.status} ${body.code ?? ""}` };
}

/** Reads the whole change feed from position 0, following `Link: rel="next"`. */
async function changeFeed(url: string): Promise<Array<{ name: string; version: string }>> {
  const changes: Array<{ name: string; version: string }> = [];
  let next: string | null = `${url}/catalog?since=0`;
  while (next) {
    const response: Response = await fetch(next);
    if (response.status !== 200) throw new Error(`catalog feed: ${response.status} ${await response.text()}`);
    const page = (await response.json()) as { changes?: Array<{ name: string; version: string }> };
    changes.push(...(page.changes ?? []));
    const link = /<([^>]+)>;\s*rel="next"/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, url).toString() : null;
  }
  return changes;
}

/** Downloads every listed version and checks its bytes against ETag, Repr-Digest and listing. */
async function checkVersions(url: string): Promise<{ served: Map<string, string>; torn: string[] }> {
  const served = new Map<string, string>();
  const torn: string[] = [];
  for (const name of PACKAGES) {
    const response = await fetch(`${url}/version/${name}`);
    if (response.status === 404) {
      await response.arrayBuffer();
      continue;
    }
    const info = (await response.json()) as { versions: Array<{ version: string; digest: string; size: number }> };
    for (const v of info.versions) {
      const spec = `${name}@${v.version}`;
      const data = await fetch(`${url}/data/${spec}`);
      const body = new Uint8Array(await data.arrayBuffer());
      const hex = createHash("sha256").update(body).digest("hex");
      const whole =
        data.status === 200 &&
        data.headers.get("etag") === `"${hex}"` &&
        data.headers.get("repr-digest") === httpDigest(body) &&
        v.digest === storeDigest(body) &&
        v.size === body.length;
      if (!whole) torn.push(`${spec} (HTTP ${data.status}, listed ${v.digest}, body sha256:${hex})`);
      served.set(spec, v.digest);
    }
  }
  return { served, torn };
}

/** Opens a transaction and adds its files; the commit is fired later, all together. */
async function prepare(url: string, name: string, version: string): Promise<Publish> {
  const id = await openTransaction(url, `${name}@${version}`);
  for (const [path, body] of Object.entries(filesOf(name, version))) {
    const response = await add(url, id, { type: "file", path, body });
    if (response.status !== 201)
      throw new Error(`add ${path} to ${name}@${version}: ${response.status} ${await response.text()}`);
  }
  return { id, name, version };
}

/** Runs the soak and returns its RELIABILITY.md section. */
export async function run({ scale }: { scale: number }): Promise<string> {
  const rounds = Math.max(1, Math.round(200 * scale));
  const data = await tempDir("soak-depot-commits-");
  const bin = await tempDir("soak-depot-commits-bin-");
  const bundle = await bundleDepotServer(bin.dir);
  const started = Date.now();
  const publishes: Publish[] = [];
  const states: Record<string, number> = {};
  const stuck: string[] = [];
  let unsettled: Publish[] = [];
  let server: DepotProcess | undefined;
  let killsMidCommit = 0;
  let answeredBeforeKill = 0;
  let retried = 0;
  let restartMs = 0;

  /** After a restart: the killed transactions are settled, never `committing`. */
  async function settle(url: string): Promise<void> {
    for (const p of unsettled) {
      const seen = await stateOf(url, p.id);
      states[seen.state] = (states[seen.state] ?? 0) + 1;
      if (seen.state === "committing") stuck.push(`${p.name}@${p.version} after restart`);
      if (seen.state === "committed") p.digest = seen.digest;
      if (seen.state === "open") {
        const answer = await commit(url, p.id);
        if (answer && (answer.status === 200 || answer.status === 201)) p.digest = answer.digest;
        retried++;
      }
    }
    unsettled = [];
  }

  try {
    for (let round = 0; round <= rounds; round++) {
      const t0 = Date.now();
      server = await spawnDepot(data.dir, 2, bundle);
      restartMs += Date.now() - t0;
      await settle(server.url);
      if (round === rounds) break;

      const batch = await Promise.all(
        PACKAGES.slice(0, PUBLISHES_PER_ROUND).map((name) => prepare(server!.url, name, `1.0.${round}`)),
      );
      publishes.push(...batch);
      const answers = batch.map(() => undefined as { status: number; digest?: string } | null | undefined);
      const commits = batch.map((p, i) => commit(server!.url, p.id).then((a) => (answers[i] = a)));
      await new Promise((resolve) => setTimeout(resolve, Math.random() * KILL_WINDOW_MS));
      const pendingAtKill = answers.filter((a) => a === undefined).length;
      await server.kill();
      await Promise.all(commits);
      if (pendingAtKill > 0) killsMidCommit++;
      batch.forEach((p, i) => {
        const a = answers[i];
        if (a?.status === 201) {
          p.digest = a.digest; // acknowledged before the kill: must survive it
          answeredBeforeKill++;
        } else unsettled.push(p);
      });
    }

    // The whole store, read by the last (unkilled) process.
    const url = server!.url;
    const finalStates: Record<string, number> = {};
    for (const p of publishes) {
      const seen = await stateOf(url, p.id);
      finalStates[seen.state] = (finalStates[seen.state] ?? 0) + 1;
      if (seen.state === "committing") stuck.push(`${p.name}@${p.version} at the end`);
      if (seen.state === "committed" && p.digest === undefined) p.digest = seen.digest;
    }
    const { served, torn } = await checkVersions(url);
    const wrongDigest: string[] = [];
    let digestsVerified = 0;
    for (const p of publishes) {
      if (p.digest === undefined) continue;
      const spec = `${p.name}@${p.version}`;
      if (served.get(spec) === p.digest) digestsVerified++;
      else wrongDigest.push(`${spec}: committed ${p.digest}, served ${served.get(spec) ?? "nothing"}`);
    }
    const committed = publishes.filter((p) => p.digest !== undefined).length;
    const feed = await changeFeed(url);
    const feedCount = new Map<string, number>();
    for (const c of feed) feedCount.set(`${c.name}@${c.version}`, (feedCount.get(`${c.name}@${c.version}`) ?? 0) + 1);
    const feedWrong = [...new Set([...served.keys(), ...feedCount.keys()])].filter(
      (spec) => !served.has(spec) || feedCount.get(spec) !== 1,
    );
    const durationS = (Date.now() - started) / 1000;
    const holds =
      torn.length === 0 &&
      stuck.length === 0 &&
      wrongDigest.length === 0 &&
      feedWrong.length === 0 &&
      served.size === committed;
    const fmt = (o: Record<string, number>) =>
      Object.entries(o)
        .map(([k, v]) => `${k} ${v}`)
        .join(", ") || "none";
    const problems = [
      ...torn.map((t) => `torn: ${t}`),
      ...stuck.map((s) => `stuck: ${s}`),
      ...wrongDigest.map((w) => `digest: ${w}`),
      ...feedWrong.map(
        (f) => `feed: ${f} appears ${feedCount.get(f) ?? 0} times${served.has(f) ? "" : " but is not listed"}`,
      ),
    ];

    return [
      "## Depot: kill -9 during commits",
      "",
      `Method: \`test/fixtures/depot-server.ts\` (\`servePackageRouter\` over \`createFsStore\`, fsync on, every store call delayed by up to 2 ms) in a child process on one data folder. Each of ${rounds} rounds (200 at scale 1) starts the server, reads \`GET /summary/<id>\` of the previous round's unanswered transactions (an \`open\` one is committed again, as a retrying client would), prepares ${PUBLISHES_PER_ROUND} publishes over HTTP (open, add 3 files), fires their commits together and sends SIGKILL after a random 0–${KILL_WINDOW_MS} ms. A last process then downloads every version \`/version\` lists (sha256 of the body against ETag, \`Repr-Digest\` and the listed digest), compares each digest a commit answered with the one served, reads every transaction's summary and walks the change feed (\`GET /catalog?since=0\`, every page).`,
      "",
      "| figure | value |",
      "|---|---:|",
      `| rounds (kills) | ${rounds} |`,
      `| kills landing mid-commit (a commit still unanswered) | ${killsMidCommit} |`,
      `| publishes attempted | ${publishes.length} |`,
      `| commits answered 201 before the kill | ${answeredBeforeKill} |`,
      `| unanswered commits re-sent after restart (found \`open\`) | ${retried} |`,
      `| publishes committed at the end | ${committed} |`,
      `| versions listed | ${served.size} |`,
      `| torn versions | ${torn.length} |`,
      `| transactions stuck in \`committing\` | ${stuck.length} |`,
      `| digests verified (committed digest = served bytes) | ${digestsVerified} of ${committed} |`,
      `| change-feed entries (each listed version exactly once) | ${feed.length} (${feedWrong.length} wrong) |`,
      `| mean restart to listening | ${(restartMs / (rounds + 1)).toFixed(0)} ms |`,
      `| duration | ${durationS.toFixed(1)} s |`,
      "",
      `States of killed transactions seen right after the restart: ${fmt(states)}. States of all ${publishes.length} transactions at the end: ${fmt(finalStates)}.`,
      "",
      holds
        ? "Result: **held** (no torn version, nothing stuck, every committed digest served, each committed version once in the feed)."
        : `Result: **did not hold**:\n\n${problems
            .slice(0, 20)
            .map((p) => `- ${p}`)
            .join("\n")}`,
    ].join("\n");
  } finally {
    await server?.kill();
    await data.cleanup();
    await bin.cleanup();
  }
}
