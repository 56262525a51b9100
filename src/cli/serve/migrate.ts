/** `runner-depot migrate <data>`: upgrades a depot store to this version's format, in place. */
import { existsSync } from "node:fs";
import path from "node:path";
import { createFsStore } from "../../adapters/fs/index.js";
import { openStoreFormat, STORE_FORMAT, upgradeStore } from "../../depot/store/format.js";
import { RunnerDepotError } from "../../errors.js";
import { CliError, type Command } from "../args.js";

const usage = `Usage: runner-depot migrate <data>

Upgrades the package store under <data> (the folder 'serve --data' uses, or a depot store
folder itself) to store format ${STORE_FORMAT}, in place. A store written by runner-depot 0.1.0
is format 1; 'serve' also upgrades it when it opens it, so this command is for doing it
ahead of time. A store whose records are still files (records/) has them imported into
records.db first (stop every older runner-depot serving <data> before). Nothing published is lost or changes its digest; running it again, or after
an interrupted run, is safe. A store newer than this runner-depot is refused.`;

export const migrateCommand: Command = {
  usage,
  options: {},
  async run(_values, positionals) {
    const [data] = positionals;
    if (!data || positionals.length > 1)
      throw new CliError("give exactly one folder: 'runner-depot migrate <data>'", 2);
    const root = path.resolve(data);
    // serve keeps the depot's store in <data>/depot; a store folder holds records.db (or,
    // written before it, records/) itself.
    const isStore = (dir: string) => existsSync(path.join(dir, "records.db")) || existsSync(path.join(dir, "records"));
    const dir = isStore(path.join(root, "depot")) ? path.join(root, "depot") : root;
    if (!isStore(dir))
      throw new CliError(
        `no depot store in ${root} (expected ${path.join(root, "depot")} or a folder holding records.db or records/)`,
      );
    const store = createFsStore(dir);
    try {
      const report = await upgradeStore(store);
      // When another process was upgrading it, wait until it has finished.
      await openStoreFormat(store);
      process.stdout.write(
        report.from === report.to
          ? `${dir}: already store format ${report.to}; nothing to do\n`
          : `${dir}: upgraded from store format ${report.from} to ${report.to} (${report.versions} versions listed and sequenced)\n`,
      );
      return 0;
    } catch (error) {
      if (error instanceof RunnerDepotError && error.code === "STORE_FORMAT_UNSUPPORTED")
        throw new CliError(`${dir}: ${error.message}`);
      throw error;
    } finally {
      await store.close?.();
    }
  },
};
