/**
 * console.js: the browser app as one script built from the source text of six
 * self-contained functions (no bundler at build or run time). `__name` is defined first
 * because some TypeScript transforms (keepNames) wrap functions in it.
 */
import { parseAnsiLine } from "./ansi.js";
import { consoleMain } from "./app.js";
import { createLogSearch } from "./search.js";
import { createSectionFolds } from "./sections.js";
import { renderPackagePage } from "./package-page.js";
import { renderHomePage } from "./home-page.js";

export const CONSOLE_JS = `"use strict";
var __name = function (f) { return f; };
(${consoleMain.toString()})(${parseAnsiLine.toString()}, ${createSectionFolds.toString()}, ${createLogSearch.toString()}, ${renderPackagePage.toString()}, ${renderHomePage.toString()});
`;
