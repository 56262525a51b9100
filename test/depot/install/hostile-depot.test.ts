/**
 * The installer and the client against a hostile depot (a node:http server on
 * 127.0.0.1:0 that says whatever an attacker wants): issue 9's link chain out of the
 * package (depot 2), refused before anything is written, for a whole archive and for a
 * delta over what is installed; and a download that announces 10 KB and streams far more
 * (depot 4): the bytes written stay at the announced size.
 */
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, readdir, symlink } from "node:fs/promises";
import path from "node:path";
import { Writable } from "node:stream";
import tar from "tar-stream";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { extractPackage } from "../../../src/depot/install/extract.js";
import type { ManifestItem } from "../../../src/depot/install/manifest.js";
import { verifyPackageTree } from "../../../src/depot/install/verify-tree.js";
import { installPackage, type InstallProgress } from "../../../src/depot/install/installer.js";
import { tempDir } from "../../fixtures/depot.js";
import { failure } from "../../fixtures/errors.js";

const UP = "a/b/c/d/e/f/g/h/up";
const UP_TARGET = "../../../../../../../..";
const PASSWD_TARGET = "a/b/c/d/e/f/g/h/up/../../../../../../../../etc/passwd";
const ATTACK: ManifestItem[] = [
  { type: "link", path: UP, target: UP_TARGET },
  { type: "link", path: "passwd", target: PASSWD_TARGET },
];

/** A deterministic-enough archive with the manifest first and the items as listed. */
async function archiveOf(items: ManifestItem[], extra: Record<string, unknown> = {}): Promise<Buffer> {
  const pack = tar.pack();
  pack.entry(
    { name: ".pkg/manifest.json", mode: 0o644 },
    JSON.stringify({ name: "evil", version: "1.0.0", attributes: {}, requires: [], licenses: [], items, ...extra }),
  );
  for (const item of items) {
    if (item.type === "link") pack.entry({ name: item.path, type: "symlink", linkname: item.target, mode: 0o777 });
    else if (item.type === "dir") pack.entry({ name: `${item.path}/`, type: "directory", mode: 0o755 });
  }
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const chunk of pack) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** Every path below `dir`, relative, links not followed. */
async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (rel: string) => {
    for (const entry of await readdir(path.join(dir, rel), { withFileTypes: true })) {
      const child = rel === "" ? entry.name : `${rel}/${entry.name}`;
      out.push(child);
      if (entry.isDirectory()) await walk(child);
    }
  };
  await walk("");
  return out.sort();
}

interface Hostile {
  url: string;
  server: Server;
  /** Bytes the /data handler managed to hand to the socket. */
  sent: { bytes: number };
}

/** A depot that announces `size` for evil@1.0.0 and answers /data with `data`. */
async function hostileDepot(
  size: number,
  digest: string,
  data: (res: import("node:http").ServerResponse, sent: { bytes: number }) => void,
): Promise<Hostile> {
  const sent = { bytes: 0 };
  const server = createServer((req, res) => {
    const json = (body: unknown) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.url === "/version/evil") {
      return json({
        name: "evil",
        latest: "1.0.0",
        versions: [
          { version: "1.0.0", publishedAt: "2026-01-01T00:00:00Z", digest, size, itemCount: 2, attributes: {} },
        ],
      });
    }
    if (req.url === "/depend/evil@1.0.0") return json({ name: "evil", version: "1.0.0", requires: [] });
    if (req.url === "/data/evil@1.0.0") return data(res, sent);
    res.writeHead(404, { "content-type": "application/problem+json" });
    res.end(JSON.stringify({ code: "NOT_FOUND", status: 404, detail: req.url }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, sent };
}

const sha = (bytes: Uint8Array) => createHash("sha256").update(bytes);
const reprDigest = (bytes: Uint8Array) => `sha-256=:${sha(bytes).digest("base64")}:`;

let tmp: { dir: string; cleanup: () => Promise<void> };
beforeEach(async () => {
  tmp = await tempDir("depot-hostile-install-");
});
afterEach(() => tmp.cleanup());

describe("link chains out of the package, at the installer (issue 9, depot 2)", () => {
  it("extractPackage refuses the issue's archive, in either link order, before writing anything", async () => {
    for (const items of [ATTACK, [...ATTACK].reverse()]) {
      const target = path.join(tmp.dir, `x${items[0]!.path.length}`);
      const error = await failure(extractPackage([await archiveOf(items)], target));
      expect(error.code).toBe("PATH_INVALID");
      expect(error.message).toMatch(/leaves the package root/);
      expect(await tree(target)).toEqual([]);
    }
  });

  it("a delta is resolved over what is installed: a new link through an installed one is refused", async () => {
    const target = path.join(tmp.dir, "installed");
    await mkdir(path.join(target, "a/b/c/d/e/f/g/h"), { recursive: true });
    await symlink(UP_TARGET, path.join(target, UP));
    const delta = await archiveOf([ATTACK[1]!], { from: "0.9.0", removed: [] });
    const error = await failure(extractPackage([delta], target, { delta: true }));
    expect(error.code).toBe("PATH_INVALID");
    expect((await tree(target)).includes("passwd")).toBe(false);
    // The tree check the installer runs after a delta refuses such a tree too.
    await symlink(PASSWD_TARGET, path.join(target, "passwd"));
    const verify = await failure(
      verifyPackageTree(target, [...ATTACK, ...["a", "a/b", "a/b/c"].map((p) => ({ type: "dir" as const, path: p }))]),
    );
    expect(verify.message).toMatch(/passwd: .*leaves the package root/);
  });

  it("installPackage from a hostile depot refuses, and the target holds nothing of the package", async () => {
    const bytes = await archiveOf(ATTACK);
    const depot = await hostileDepot(bytes.length, `sha256:${sha(bytes).digest("hex")}`, (res) => {
      res.writeHead(200, {
        "content-type": "application/x-tar",
        "content-length": String(bytes.length),
        "repr-digest": reprDigest(bytes),
      });
      res.end(bytes);
    });
    try {
      const target = path.join(tmp.dir, "vendor");
      const error = await failure(installPackage(createDepotClient({ baseUrl: depot.url }), "evil", target));
      expect(error.code).toBe("PATH_INVALID");
      const left = await tree(target);
      expect(left.filter((p) => !p.startsWith(".runner-depot"))).toEqual([]);
      expect(left.some((p) => p.endsWith("passwd"))).toBe(false);
    } finally {
      await new Promise((resolve) => depot.server.close(resolve));
    }
  });
});

describe("downloads stop at the announced size (issue 9, depot 4)", () => {
  const ANNOUNCED = 10 * 1024;
  const CHUNK = Buffer.alloc(64 * 1024, 0x61);
  let chunked: Hostile;
  let overlong: Hostile;

  beforeAll(async () => {
    // Chunked, no Content-Length: streams up to 64 MiB unless the client goes away.
    chunked = await hostileDepot(ANNOUNCED, `sha256:${"0".repeat(64)}`, (res, sent) => {
      res.writeHead(200, {
        "content-type": "application/x-tar",
        "repr-digest": `sha-256=:${Buffer.alloc(32).toString("base64")}:`,
      });
      let mine = 0; // per response: each test gets its own flood
      const pump = () => {
        while (mine < 64 * 2 ** 20 && !res.destroyed) {
          mine += CHUNK.length;
          sent.bytes += CHUNK.length;
          if (!res.write(CHUNK)) return void res.once("drain", pump);
        }
        res.end();
      };
      res.on("close", () => undefined);
      pump();
    });
    // Content-Length 10 KB, then a megabyte more on the same socket.
    overlong = await hostileDepot(ANNOUNCED, `sha256:${"0".repeat(64)}`, (res, sent) => {
      res.socket!.write(
        `HTTP/1.1 200 OK\r\ncontent-type: application/x-tar\r\ncontent-length: ${ANNOUNCED}\r\nrepr-digest: sha-256=:${Buffer.alloc(32).toString("base64")}:\r\n\r\n`,
      );
      for (let i = 0; i < 16; i++) {
        sent.bytes += CHUNK.length;
        res.socket!.write(CHUNK);
      }
      res.socket!.end();
    });
  });
  afterAll(async () => {
    for (const d of [chunked, overlong]) {
      d.server.closeAllConnections();
      await new Promise((resolve) => d.server.close(resolve));
    }
  });

  /** A sink that counts what it is given. */
  function counting(): { sink: Writable; written: () => number } {
    let written = 0;
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        written += chunk.length;
        done();
      },
    });
    return { sink, written: () => written };
  }

  it("client.download with the announced size writes at most that many bytes of a chunked flood", async () => {
    const { sink, written } = counting();
    const error = await failure(
      createDepotClient({ baseUrl: chunked.url }).download("evil@1.0.0", { to: sink, expectedSize: ANNOUNCED }),
    );
    expect(error.code).toBe("DIGEST_MISMATCH");
    expect(error.message).toMatch(/past the 10240 bytes announced/);
    expect(written()).toBeLessThanOrEqual(ANNOUNCED);
  });

  it("the installer passes /version's size: the archive file never grows past it", async () => {
    const events: InstallProgress[] = [];
    const target = path.join(tmp.dir, "vendor");
    const error = await failure(
      installPackage(createDepotClient({ baseUrl: chunked.url }), "evil", target, {
        onProgress: (e) => events.push(e),
      }),
    );
    expect(error.code).toBe("DIGEST_MISMATCH");
    const received = events.flatMap((e) => (e.phase === "download" ? [e.received] : []));
    expect(Math.max(0, ...received)).toBeLessThanOrEqual(ANNOUNCED);
    expect((await tree(target)).filter((p) => !p.startsWith(".runner-depot"))).toEqual([]);
  });

  it("a body longer than its Content-Length is read up to it only", async () => {
    const { sink, written } = counting();
    const error = await failure(createDepotClient({ baseUrl: overlong.url }).download("evil@1.0.0", { to: sink }));
    expect(error.code).toBe("DIGEST_MISMATCH");
    expect(written()).toBeLessThanOrEqual(ANNOUNCED);
  });

  it("a cap (maxBytes) for what nothing announces stops a flood with TOO_LARGE", async () => {
    const { sink, written } = counting();
    const error = await failure(
      createDepotClient({ baseUrl: chunked.url }).download("evil@1.0.0", { to: sink, maxBytes: 100_000 }),
    );
    expect(error.code).toBe("TOO_LARGE");
    expect(written()).toBeLessThanOrEqual(100_000);
  });
});
