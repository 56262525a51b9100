/**
 * `npm run bench`: runs every benchmark module in bench/ (each exports
 * `run(): Promise<string>` returning a Markdown section) and writes BENCHMARKS.md
 * with the machine and the date. `npm run bench -- runner` runs the named ones only.
 */
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = ["runner", "depot", "backends"];
const only = process.argv.slice(2);

const sections: string[] = [];
for (const name of modules) {
  if (only.length > 0 && !only.includes(name)) continue;
  const file = path.join(here, `${name}.ts`);
  if (!existsSync(file)) continue;
  console.error(`bench: ${name}…`);
  const mod = (await import(pathToFileURL(file).href)) as { run(): Promise<string> };
  sections.push(await mod.run());
}

const cpus = os.cpus();
const header = [
  "# Benchmarks",
  "",
  `Written by \`npm run bench\` on ${new Date().toISOString().slice(0, 10)}.`,
  "",
  `Machine: ${cpus.length} × ${cpus[0]?.model.trim() ?? "unknown CPU"}, ${Math.round(os.totalmem() / 2 ** 30)} GiB RAM, ` +
    `${os.type()} ${os.release()}, Node ${process.version}.`,
  "",
  "Every figure is from one run; each row names the peer measured in the same run, and ratios are ours ÷ peer.",
  "",
].join("\n");
await writeFile(path.join(here, "..", "BENCHMARKS.md"), `${header}\n${sections.join("\n\n")}\n`);
console.error("bench: wrote BENCHMARKS.md");
