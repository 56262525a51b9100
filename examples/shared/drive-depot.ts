/**
 * What every depot example does to itself once it listens: publish a package through
 * the real HTTP interface, read the catalog, download the archive (its digest checked
 * against Repr-Digest) and read its manifest. One file is 2 MiB, more than Fastify's
 * 1 MiB bodyLimit, so a mounting that buffered request bodies would refuse it.
 * Not an example of its own.
 */
import { randomBytes } from "node:crypto";
import { Writable } from "node:stream";
import { createDepotClient } from "runner-depot/depot";

/** Publishes `hello@1.0.0` through `baseUrl` and reads it back; prints what happened. */
export async function driveDepot(baseUrl: string, label: string): Promise<void> {
  const client = createDepotClient({ baseUrl });
  const published = await client.publish({
    name: "hello",
    version: "1.0.0",
    items: [
      { type: "dir", path: "bin" },
      { type: "file", path: "bin/hello", mode: 0o755, content: "#!/bin/sh\necho hello\n" },
      { type: "link", path: "bin/hi", target: "hello" },
      { type: "file", path: "share/hello/data.bin", content: randomBytes(2 * 1024 * 1024) },
    ],
    requires: { libc: ">=2" },
    attributes: { description: "Says hello" },
    license: { name: "MIT", text: "MIT License\n" },
  });
  console.log(
    `${label}: published ${published.name}@${published.version} (${published.uploaded} files uploaded) -> ${published.url}`,
  );

  const catalog = await client.catalog();
  console.log(`${label}: GET ${baseUrl}/catalog -> ${JSON.stringify(catalog.packages)}`);

  let received = 0;
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      received += chunk.length;
      done();
    },
  });
  const download = await client.download("hello@1.0.0", { to: sink });
  console.log(`${label}: GET ${download.url} -> ${received} bytes, ${download.digest} verified`);

  const manifest = await client.manifest("hello");
  console.log(`${label}: manifest items ${manifest.items.map((i) => `${i.type}:${i.path}`).join(" ")}`);
}
