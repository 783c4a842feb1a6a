import { describe, expect, it } from "vitest";
import { functionFiles, functionsText, functionsVersion } from "../../src/db/functions.js";

// The hash of the database functions' files for each version. A replica
// applies its functions only when its version is at least the installed
// one (src/db/functions.ts): a file changed without a new version would be
// two texts under one version, and replicas of both would undo each other.
// Changing a file in src/*/sql/*.sql: raise functionsVersion and add
// its hash here.
const hashes: Record<number, string> = {
  1: "1ac462b9a5c12137ee09989dafb1704f429e5a477d4b8968edad233f512d1f1e",
  2: "b31e26219186b344bde3a13824d741c40c09e9789318b931e3b79e6c888bf7f8",
  3: "2b0643b16ab2a885871fa988c5976b8ba7e6500e817dff86db6f817a348aff1f",
  4: "8c866a19c29c61c78df2e88bce1aa4d01d191c239f94a6fd12dd6afef1566689",
  5: "ca8ad106f3d5c87a01b94fe19b4a6215f5c583377b82a2d38b5ec6499baa572f",
  6: "fc4ac543606537eabf597e685802f3815b4bed3b7197b13cfe242d8c44fc656a",
  7: "07b1f2a293a8ba1f38c24cafdcc46a056f41724db3b869740eee7fa57f6dbc50",
  8: "6a9ff3418ade1774f67ee3db73def242bad1a4895171a46c6026556fb666cf8c",
  9: "a0bbb322365fc546aabef9881daa518dee647561e4258034b60c94bb7abc52ab",
  10: "4a33bbe5e262beb74fe09249b366985f38c1ad2c92ed279b761130ecd45b4562",
  11: "8733605f0ee1db51d7a62fa33266ee28d6fcb4bc39d25db45177edbf51bd8e72",
  12: "be6a5094c57ca0fcd3107d690cda776ff95bec2953fc973288136c26cbff0d87",
  13: "e1e34fbca6492d623fde7f91198e3fd185c1e326be4f753506d7b4be30f093be",
  14: "d7c4d3864ca58be69d99429d4d86296745f8bc674371d0e49b3d3e929ac508c5",
  15: "6bdc2eb7f9ee22c457bac09bfde6f1bc37726747c6343769e2c6214c5814f91e",
  16: "079f191956ca523d0bee72779a1565a82933ab16316558bdf6c639874d288a2f",
  17: "27243cf95f63c198a875ea6d4de4ed7216e1097c2157f4bf6c19870e3782ceaa",
  18: "4db67c6058cc576a3279adab752cfa85fa23cf2f6180c63817a68f17907dde36",
  19: "016b1da4fe12c37ce12e4e65a3e9717d6811abfed0f85ace352c659d1d4c5437",
  20: "abc3bc66cc483e5138728514c3e28bf4fe653bdfd164eb30eaf0fa53983d0637",
  21: "65faa26bf30659d50ccda4e3937f7369b1e529839c4d8a6129108f7f361adfe9",
};

describe("database functions", () => {
  it("have a new version for every change of their text", () => {
    expect({ version: functionsVersion, hash: functionsText().hash }).toEqual({
      version: functionsVersion,
      hash: hashes[functionsVersion],
    });
  });

  it("are every .sql file of a src/<feature>/sql folder, each once", async () => {
    const { existsSync, readdirSync } = await import("node:fs");
    const src = new URL("../../src/", import.meta.url);
    const onDisk = readdirSync(src, { withFileTypes: true })
      .filter((d) => d.isDirectory() && existsSync(new URL(`${d.name}/sql/`, src)))
      .flatMap((d) =>
        readdirSync(new URL(`${d.name}/sql/`, src))
          .filter((f) => f.endsWith(".sql"))
          .map((f) => `${d.name}/sql/${f}`),
      )
      .sort();
    expect([...functionFiles].sort()).toEqual(onDisk);
  });
});
