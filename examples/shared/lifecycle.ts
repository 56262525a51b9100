/**
 * How every server example ends: with `--serve` it stays up until SIGTERM or SIGINT;
 * otherwise it drives itself once, shuts down and says so. Not an example of its own.
 */
import type { Server } from "node:http";

/** Closes a node:http server and every connection it still holds. */
export function closeHttpServer(server: Server): Promise<void> {
  return new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/** Serves until a signal (`--serve`), or runs `drive` once; `shutdown` runs either way. */
export async function serveOrDrive(
  label: string,
  shutdown: () => Promise<void>,
  drive: () => Promise<void>,
): Promise<void> {
  if (process.argv.includes("--serve")) {
    const stop = () => void shutdown().then(() => process.exit(0));
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
    return;
  }
  await drive();
  await shutdown();
  console.log(`${label}: done`);
}

/** GETs `path` from an h2c server (the examples' own non-gRPC route) and returns the body. */
export async function getOverH2c(origin: string, path: string): Promise<string> {
  const { connect } = await import("node:http2");
  const session = connect(origin);
  try {
    return await new Promise<string>((resolve, reject) => {
      const req = session.request({ ":path": path });
      let body = "";
      req.setEncoding("utf8");
      req.on("data", (chunk: string) => (body += chunk));
      req.on("end", () => resolve(body));
      req.on("error", reject);
      req.end();
    });
  } finally {
    session.close();
  }
}

/**
 * Tracks an HTTP/2 server's sessions; `closeAll()` sends GOAWAY and destroys them, since
 * closing the server waits for idle sessions that a client keeps open.
 */
export function trackH2Sessions(server: import("node:http2").Http2Server): { closeAll(): void } {
  const sessions = new Set<import("node:http2").ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  return {
    closeAll() {
      for (const session of sessions) {
        if (session.destroyed) continue;
        session.goaway();
        session.destroy();
      }
    },
  };
}
