export * from "./tables.js";
