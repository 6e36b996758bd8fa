package docblocks

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	page := "# Title\n\n```sh\nkubectl get nodes\n```\n\n```yaml\nkind: Pod\n```\n\n- a list:\n\n  ```sh\n  helm uninstall kpr\n  kubectl apply -f x.yaml\n  ```\n"
	got, err := Parse(page)
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{Line: 3, Script: "kubectl get nodes\n"},
		{Line: 13, Script: "helm uninstall kpr\nkubectl apply -f x.yaml\n"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %#v, want %#v", got, want)
	}
	if _, err := Parse("```sh\nls\n"); err == nil {
		t.Error("an unclosed block parsed")
	}
}
