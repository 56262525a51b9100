/**
 * nginx as the depot benches' peer: started on 127.0.0.1 with a temp config and prefix
 * (not a system service), serving static files from `root`, optionally with WebDAV `PUT`
 * under /dav/ for the upload rows.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdir, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { waitForPort } from "./children.js";

const run$ = promisify(execFile);

/** A port free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/**
 * Starts nginx (`bin`) with its prefix under `work`, serving `root`; with `dav`, `PUT`
 * under /dav/ lands in `root/dav` and its body temp files are on `root`'s disk too.
 */
export async function startNginx(
  bin: string,
  work: string,
  root: string,
  options: { dav?: boolean } = {},
): Promise<{ url: string; child: ChildProcess; version: string }> {
  const port = await freePort();
  const prefix = path.join(work, "nginx");
  await mkdir(path.join(prefix, "logs"), { recursive: true });
  if (options.dav) await mkdir(path.join(root, "dav"), { recursive: true });
  const conf = path.join(prefix, "nginx.conf");
  const user = process.getuid?.() === 0 ? "user root;" : "";
  const dav = options.dav
    ? `
    location /dav/ {
      dav_methods PUT;
      create_full_put_path on;
      client_max_body_size 0;
    }`
    : "";
  await writeFile(
    conf,
    `${user}
worker_processes 1;
daemon off;
master_process on;
pid ${prefix}/nginx.pid;
error_log ${prefix}/logs/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  default_type application/octet-stream;
  client_body_temp_path ${options.dav ? `${root}/dav-tmp` : `${prefix}/body`};
  proxy_temp_path ${prefix}/proxy;
  fastcgi_temp_path ${prefix}/fastcgi;
  uwsgi_temp_path ${prefix}/uwsgi;
  scgi_temp_path ${prefix}/scgi;
  server {
    listen 127.0.0.1:${port};
    root ${root};${dav}
  }
}
`,
  );
  const child = spawn(bin, ["-p", prefix, "-c", conf], { stdio: ["ignore", "inherit", "inherit"] });
  await waitForPort(port, child);
  const { stderr } = await run$(bin, ["-v"]);
  return { url: `http://127.0.0.1:${port}`, child, version: stderr.trim().replace(/^nginx version: nginx\//, "") };
}
