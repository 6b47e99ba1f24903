package credit

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// The departed cache holds no pointer: the collector never marks it,
// however many keys it remembers.
func TestDepartedHoldsNoPointers(t *testing.T) {
	var walk func(reflect.Type) bool
	walk = func(ty reflect.Type) bool {
		switch ty.Kind() {
		case reflect.Bool, reflect.Int32, reflect.Int64, reflect.Uint8, reflect.Uint64:
			return true
		case reflect.Array:
			return walk(ty.Elem())
		case reflect.Struct:
			for i := range ty.NumField() {
				if !walk(ty.Field(i).Type) {
					t.Errorf("%s.%s is a %s", ty.Name(), ty.Field(i).Name, ty.Field(i).Type)
					return false
				}
			}
			return true
		}
		return false
	}
	require.True(t, walk(reflect.TypeOf(departedSlot{})))
}
