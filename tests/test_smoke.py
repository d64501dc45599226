from tests.helpers import Api


async def test_org_roundtrip(api: Api) -> None:
    org = await api.org()
    r = await api.call("GET", org.path(), org.member)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "active"
    r = await api.call("GET", "/orgs", org.customer)
    assert [o["id"] for o in r.json()["items"]] == [org.id]
