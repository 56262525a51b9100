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
export async function serveOrDrive(label: string, shutdown: () => Promise<void>, drive: () => Promise<void>): Promise<void> {
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
