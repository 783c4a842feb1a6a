export * from "./tables.js";
export * from "./workflows.js";
